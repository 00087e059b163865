package cli

import (
	"flag"
	"fmt"
	"sort"
	"strings"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/pkg/codec"
)

// enumFlag is a flag whose value is one of a fixed set of names.
type enumFlag[T comparable] struct {
	p     *T
	names map[string]T
}

func newEnumFlag[T comparable](p *T, names map[string]T) *enumFlag[T] {
	return &enumFlag[T]{p: p, names: names}
}

func (e *enumFlag[T]) String() string {
	if e == nil || e.p == nil {
		return ""
	}
	for n, v := range e.names {
		if v == *e.p {
			return n
		}
	}
	return ""
}

func (e *enumFlag[T]) Set(s string) error {
	v, ok := e.names[strings.ToLower(s)]
	if !ok {
		return fmt.Errorf("%q is not one of %s", s, e.choices())
	}
	*e.p = v
	return nil
}

func (e *enumFlag[T]) choices() string {
	var ns []string
	for n := range e.names {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return strings.Join(ns, ", ")
}

func durabilityFlag(fs *flag.FlagSet, p *walshipv1.Durability) {
	fs.Var(newEnumFlag(p, map[string]walshipv1.Durability{
		"sync": walshipv1.Durability_DURABILITY_SYNC, "async": walshipv1.Durability_DURABILITY_ASYNC,
	}), "durability", "default local durability: sync (ack after fsync) or async (ack after write, fsync within --async-flush-interval)")
}

func replicationFlag(fs *flag.FlagSet, p *walshipv1.ReplicationMode) {
	fs.Var(newEnumFlag(p, map[string]walshipv1.ReplicationMode{
		"disabled": walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED,
		"async":    walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC,
		"sync":     walshipv1.ReplicationMode_REPLICATION_MODE_SYNC,
	}), "replication", "default replication: disabled, async, or sync (wait for --sync-replicas replicas at --sync-level)")
}

func syncLevelFlag(fs *flag.FlagSet, p *walshipv1.SyncLevel) {
	fs.Var(newEnumFlag(p, map[string]walshipv1.SyncLevel{
		"write": walshipv1.SyncLevel_SYNC_LEVEL_WRITE,
		"flush": walshipv1.SyncLevel_SYNC_LEVEL_FLUSH,
		"apply": walshipv1.SyncLevel_SYNC_LEVEL_APPLY,
	}), "sync-level", "replica stage a sync commit waits for: write, flush or apply")
}

func logstoreAckFlag(fs *flag.FlagSet, p *walshipv1.LogStoreAck) {
	fs.Var(newEnumFlag(p, map[string]walshipv1.LogStoreAck{
		"async": walshipv1.LogStoreAck_LOG_STORE_ACK_ASYNC,
		"sync":  walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC,
	}), "logstore-ack", "default log store wait: async, or sync (a majority of --logstore has fsynced)")
}

// codecFlag is a flag naming a codec.
type codecFlag struct{ p *codec.Codec }

func (c codecFlag) String() string {
	if c.p == nil || *c.p == nil {
		return ""
	}
	return (*c.p).Name()
}

func (c codecFlag) Set(s string) error {
	v, err := codec.ByName(s)
	if err != nil {
		return err
	}
	*c.p = v
	return nil
}

// listFlag is a comma-separated list of strings.
type listFlag struct{ p *[]string }

func (l listFlag) String() string {
	if l.p == nil {
		return ""
	}
	return strings.Join(*l.p, ",")
}

func (l listFlag) Set(s string) error {
	*l.p = nil
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*l.p = append(*l.p, part)
		}
	}
	return nil
}

// fieldsFlag is a list of words separated by spaces (a command line's
// flags, without quoting).
type fieldsFlag struct{ p *[]string }

func (f fieldsFlag) String() string {
	if f.p == nil {
		return ""
	}
	return strings.Join(*f.p, " ")
}

func (f fieldsFlag) Set(s string) error {
	*f.p = strings.Fields(s)
	return nil
}
