package primary

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Policy is a fully resolved commit policy: no field is "unspecified".
type Policy struct {
	Durability   walshipv1.Durability
	Replication  walshipv1.ReplicationMode
	SyncReplicas int
	SyncLevel    walshipv1.SyncLevel
	LogStore     walshipv1.LogStoreAck
	SyncTimeout  time.Duration
}

// DefaultPolicy is the policy of a primary started without policy flags.
func DefaultPolicy() Policy {
	return Policy{
		Durability:   walshipv1.Durability_DURABILITY_SYNC,
		Replication:  walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC,
		SyncReplicas: 1,
		SyncLevel:    walshipv1.SyncLevel_SYNC_LEVEL_FLUSH,
		LogStore:     walshipv1.LogStoreAck_LOG_STORE_ACK_ASYNC,
		SyncTimeout:  10 * time.Second,
	}
}

// Validate reports the first field of p that is unset or out of range.
func (p Policy) Validate() error {
	if _, ok := walshipv1.Durability_name[int32(p.Durability)]; !ok || p.Durability == walshipv1.Durability_DURABILITY_UNSPECIFIED {
		return fmt.Errorf("durability: %v is not async or sync", p.Durability)
	}
	if _, ok := walshipv1.ReplicationMode_name[int32(p.Replication)]; !ok || p.Replication == walshipv1.ReplicationMode_REPLICATION_MODE_UNSPECIFIED {
		return fmt.Errorf("replication: %v is not disabled, async or sync", p.Replication)
	}
	if _, ok := walshipv1.SyncLevel_name[int32(p.SyncLevel)]; !ok || p.SyncLevel == walshipv1.SyncLevel_SYNC_LEVEL_UNSPECIFIED {
		return fmt.Errorf("sync_level: %v is not write, flush or apply", p.SyncLevel)
	}
	if _, ok := walshipv1.LogStoreAck_name[int32(p.LogStore)]; !ok || p.LogStore == walshipv1.LogStoreAck_LOG_STORE_ACK_UNSPECIFIED {
		return fmt.Errorf("logstore: %v is not async or sync", p.LogStore)
	}
	if p.SyncReplicas < 1 || p.SyncReplicas > maxSyncReplicas {
		return fmt.Errorf("sync_replicas: %d is not in 1..%d", p.SyncReplicas, maxSyncReplicas)
	}
	if p.SyncTimeout <= 0 || p.SyncTimeout > maxSyncTimeout {
		return fmt.Errorf("sync_timeout: %v is not in (0, %v]", p.SyncTimeout, maxSyncTimeout)
	}
	return nil
}

const (
	maxSyncReplicas = 64
	maxSyncTimeout  = 10 * time.Minute
)

// Merge returns p with every field that req sets replaced. The result is
// validated; the error names the offending request field.
func (p Policy) Merge(req *walshipv1.CommitPolicy) (Policy, error) {
	if req == nil {
		return p, nil
	}
	if req.Durability != walshipv1.Durability_DURABILITY_UNSPECIFIED {
		p.Durability = req.Durability
	}
	if req.Replication != walshipv1.ReplicationMode_REPLICATION_MODE_UNSPECIFIED {
		p.Replication = req.Replication
	}
	if req.SyncReplicas != 0 {
		p.SyncReplicas = int(req.SyncReplicas)
	}
	if req.SyncLevel != walshipv1.SyncLevel_SYNC_LEVEL_UNSPECIFIED {
		p.SyncLevel = req.SyncLevel
	}
	if req.Logstore != walshipv1.LogStoreAck_LOG_STORE_ACK_UNSPECIFIED {
		p.LogStore = req.Logstore
	}
	if req.SyncTimeout != nil {
		if err := req.SyncTimeout.CheckValid(); err != nil {
			return p, fmt.Errorf("sync_timeout: %w", err)
		}
		p.SyncTimeout = req.SyncTimeout.AsDuration()
	}
	if err := p.Validate(); err != nil {
		return p, err
	}
	return p, nil
}

// Proto returns p as the API message.
func (p Policy) Proto() *walshipv1.CommitPolicy {
	return &walshipv1.CommitPolicy{
		Durability:   p.Durability,
		Replication:  p.Replication,
		SyncReplicas: uint32(p.SyncReplicas),
		SyncLevel:    p.SyncLevel,
		Logstore:     p.LogStore,
		SyncTimeout:  durationpb.New(p.SyncTimeout),
	}
}

// waitsForPeers reports whether a commit under p waits for replicas or
// log stores (awaitPeers).
func (p Policy) waitsForPeers() bool {
	return p.Replication == walshipv1.ReplicationMode_REPLICATION_MODE_SYNC ||
		p.LogStore == walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC
}

// needsLocalSync reports whether a commit under p must wait for the local
// fsync before it is acknowledged. A synchronous wait for replicas implies
// it: replicas get such a commit before the primary's fsync (the two run in
// parallel), but a replica cuts what a crash of the primary lost, so the
// commit is safe only once the primary has it too. Log stores get durable
// WAL only, so a wait for them implies it as well.
func (p Policy) needsLocalSync() bool {
	return p.Durability == walshipv1.Durability_DURABILITY_SYNC ||
		p.Replication == walshipv1.ReplicationMode_REPLICATION_MODE_SYNC ||
		p.LogStore == walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC
}

// validatePolicyEnums checks the enum fields of a request's policy are
// known values, naming the field; Merge range-checks the rest.
func validatePolicyEnums(p *walshipv1.CommitPolicy) error {
	if p == nil {
		return nil
	}
	check := func(field string, v int32, names map[int32]string) error {
		if _, ok := names[v]; !ok {
			return status.Errorf(codes.InvalidArgument, "policy.%s: unknown value %d", field, v)
		}
		return nil
	}
	for _, err := range []error{
		check("durability", int32(p.Durability), walshipv1.Durability_name),
		check("replication", int32(p.Replication), walshipv1.ReplicationMode_name),
		check("sync_level", int32(p.SyncLevel), walshipv1.SyncLevel_name),
		check("logstore", int32(p.Logstore), walshipv1.LogStoreAck_name),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

// checkSyncReplicas refuses a sync commit policy that waits for more
// replicas than the cluster has members to acknowledge it (the members
// but this primary): such a commit would be written and then time out,
// its outcome unknown. Without members (--peers) every replica counts
// and none is known in advance: nothing is refused.
func (s *Server) checkSyncReplicas(p Policy) error {
	if p.Replication != walshipv1.ReplicationMode_REPLICATION_MODE_SYNC {
		return nil
	}
	r := s.peers.ruleNow.Load()
	if r == nil || r.members == nil {
		return nil
	}
	if n := r.minVoters; p.SyncReplicas > n {
		half := ""
		if len(r.members) > 1 {
			half = " in each half of the membership change in progress"
		}
		return fmt.Errorf("sync_replicas: %d is more than the %d other members that can acknowledge a commit%s (%s)", p.SyncReplicas, n, half, strings.Join(slices.Sorted(maps.Keys(r.eligible)), ", "))
	}
	return nil
}
