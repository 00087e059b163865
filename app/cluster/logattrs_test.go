package cluster

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
)

// attrCheck is a slog.Handler that records every record whose attributes
// (those its logger was given with With, and its own) name a key twice.
type attrCheck struct {
	keys []string // from With, in order
	mu   *sync.Mutex
	dups *[]string
}

func (h attrCheck) Enabled(context.Context, slog.Level) bool { return true }

func (h attrCheck) Handle(_ context.Context, r slog.Record) error {
	keys := slices.Clone(h.keys)
	r.Attrs(func(a slog.Attr) bool {
		keys = append(keys, a.Key)
		return true
	})
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k] {
			h.mu.Lock()
			*h.dups = append(*h.dups, r.Message+": "+strings.Join(keys, ","))
			h.mu.Unlock()
			break
		}
		seen[k] = true
	}
	return nil
}

func (h attrCheck) WithAttrs(as []slog.Attr) slog.Handler {
	keys := slices.Clone(h.keys)
	for _, a := range as {
		keys = append(keys, a.Key)
	}
	h.keys = keys
	return h
}

func (h attrCheck) WithGroup(name string) slog.Handler {
	h.keys = append(slices.Clone(h.keys), name+".")
	return h
}

// TestLogAttributesOnce: no log record of a cluster's nodes names an
// attribute twice (it said node=primary node=primary: the cluster and the
// data node both added it).
func TestLogAttributesOnce(t *testing.T) {
	var mu sync.Mutex
	var dups []string
	c, err := Start(t.Context(), fast(Config{Dir: t.TempDir(), LogStores: 1, Replicas: 1, Failover: true,
		Logger: slog.New(attrCheck{mu: &mu, dups: &dups})}))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(dups) > 0 {
		t.Fatalf("%d records name an attribute twice, e.g.:\n%s", len(dups), strings.Join(dups[:min(5, len(dups))], "\n"))
	}
}
