package primary

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/tlsid"
	"google.golang.org/grpc/codes"
)

// Write admission: what writes may hold on the primary, and how fast one
// identity may write.
//
// A write's request stays in memory from its arrival until it is
// answered: while it waits for its group fsync, its replicas and its log
// stores. Per connection gRPC bounds little (internal/serve's limits are
// per identity, and data-node transports are wide), so the bytes of every
// write in flight, whoever sent it, are counted against
// Config.MaxInflightCommitBytes; past it a write is refused before it is
// sequenced — RESOURCE_EXHAUSTED, not applied, retryable.
//
// Config.WriteQuotaBytesPerSecond is a per-identity byte rate, as
// Kafka's client quotas (producer_byte_rate) are: each identity (its
// certificate's principal; all plaintext callers share "") has a bucket
// that refills at the rate and holds one second of it. A write is
// admitted while the bucket is not in debt, and takes its size out of it
// even past zero, so a write larger than a second's worth still passes
// once the identity has been quiet. While in debt, the identity's writes
// are refused with the time until the debt is paid (Kafka's throttle
// time) in a RetryInfo, which pkg/client waits out before it tries
// again. Kafka delays the response and mutes the connection instead; a
// refusal before sequencing keeps the outcome known ("not applied") and
// holds no memory for the throttled.
type admission struct {
	limit    int64
	inflight atomic.Int64

	rate    float64 // bytes per second per identity; 0: no quota
	mu      sync.Mutex
	buckets map[string]*bucket
	now     func() time.Time

	refused   *prometheus.CounterVec // walship_write_refusals_total{limit}
	throttled *prometheus.CounterVec // walship_write_quota_throttle_seconds_total{identity}
}

type bucket struct {
	tokens float64
	at     time.Time
}

// quotaIdle is how long an identity's bucket is kept after it filled up
// again: a full bucket is the same as none.
const quotaIdle = time.Minute

func newAdmission(limit, rate int64) *admission {
	return &admission{limit: limit, rate: float64(rate), buckets: map[string]*bucket{}, now: time.Now,
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "walship_write_refusals_total",
			Help: "Writes the primary refused before sequencing them (RESOURCE_EXHAUSTED, not applied), by limit: inflight_bytes (--max-inflight-commit-bytes) or quota (--write-quota-bytes-per-second).",
		}, []string{"limit"}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "walship_write_quota_throttle_seconds_total",
			Help: "Throttle time the primary asked of each identity's refused writes (--write-quota-bytes-per-second; \"\" is every plaintext caller): how far over its byte rate it wrote.",
		}, []string{"identity"}),
	}
}

// collectors are the admission's metrics.
func (a *admission) collectors() []prometheus.Collector {
	a.refused.WithLabelValues("inflight_bytes")
	a.refused.WithLabelValues("quota")
	// Exported from the start, as the refusals are; other identities
	// appear once throttled.
	a.throttled.WithLabelValues("")
	return []prometheus.Collector{a.refused, a.throttled, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_write_inflight_bytes",
		Help: "Bytes of the write requests the primary holds, from their arrival until they are answered (bounded by --max-inflight-commit-bytes).",
	}, func() float64 { return float64(a.inflight.Load()) })}
}

// admit admits a write of n bytes from ctx's peer, or refuses it; the
// caller releases what it returns, once, when the write is answered.
func (a *admission) admit(ctx context.Context, n int) (admitted, error) {
	if a.rate > 0 {
		if err := a.charge(tlsid.Peer(ctx), n); err != nil {
			return admitted{}, err
		}
	}
	if a.limit <= 0 {
		return admitted{}, nil
	}
	w := int64(n)
	// A write larger than the bound passes when nothing else is in
	// flight: the message limit, not this bound, decides what is too big.
	if now := a.inflight.Add(w); now > a.limit && now != w {
		a.inflight.Add(-w)
		a.refused.WithLabelValues("inflight_bytes").Inc()
		return admitted{}, rpcerr.NotApplied(codes.ResourceExhausted, "INFLIGHT_BYTES", 50*time.Millisecond,
			"primary holds %d bytes of writes in flight, --max-inflight-commit-bytes is %d: write refused, not applied; retry", now-w, a.limit)
	}
	return admitted{a: a, bytes: w}, nil
}

// admitted is a write admit let in: a value, not a closure, so that a
// write allocates nothing to be admitted. Each caller releases it once
// (with defer).
type admitted struct {
	a     *admission // nil if nothing is held
	bytes int64
}

// release gives back the write's bytes of the in-flight bound.
func (h admitted) release() {
	if h.a != nil {
		h.a.inflight.Add(-h.bytes)
	}
}

// charge takes n bytes from id's bucket, or refuses while it is in debt.
func (a *admission) charge(id string, n int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	b, ok := a.buckets[id]
	if !ok {
		b = &bucket{tokens: a.rate, at: now}
		a.buckets[id] = b
		if len(a.buckets) > 1 {
			a.dropIdle(now)
		}
	}
	b.tokens = min(a.rate, b.tokens+a.rate*now.Sub(b.at).Seconds())
	b.at = now
	if b.tokens < 0 {
		wait := time.Duration(-b.tokens / a.rate * float64(time.Second))
		a.refused.WithLabelValues("quota").Inc()
		a.throttled.WithLabelValues(id).Add(wait.Seconds())
		who := id
		if who == "" {
			who = "plaintext callers"
		}
		return rpcerr.NotApplied(codes.ResourceExhausted, "QUOTA_EXCEEDED", wait,
			"%s wrote over --write-quota-bytes-per-second %.0f: write refused, not applied; retry after %v", who, a.rate, wait.Round(time.Millisecond))
	}
	b.tokens -= float64(n)
	return nil
}

// dropIdle forgets the buckets that have filled up again long ago.
func (a *admission) dropIdle(now time.Time) {
	for id, b := range a.buckets {
		if b.tokens+a.rate*now.Sub(b.at).Seconds() >= a.rate && now.Sub(b.at) > quotaIdle {
			delete(a.buckets, id)
		}
	}
}
