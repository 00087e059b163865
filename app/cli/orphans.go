package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/keyspace"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/pkg/client"
	"github.com/walship/walship/pkg/codec"
)

// walship ctl orphans: what a node cut from its log because the cluster's
// history went another way (docs/FORMAT.md, "Orphan files"), in terms an
// application owner can act on: which keys, which values, committed when,
// and how they compare with the cluster's state now.

func ctlOrphansListFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	var dataDir string
	var nodes []string
	fs.StringVar(&dataDir, "data-dir", "", "a node's data directory: list DATA_DIR/orphans")
	fs.Var(listFlag{&nodes}, "nodes", "gRPC addresses of nodes (data nodes or log stores) to list the orphans of, comma-separated, instead of --data-dir")
	sf := addSecurityFlags(fs, false)
	return func(ctx context.Context) error {
		if (dataDir == "") == (len(nodes) == 0) {
			return usageErr(env, "--data-dir or --nodes: exactly one is required")
		}
		w := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "WHERE\tFILE\tEPOCH\tLSNS\tBYTES\tCUT")
		if dataDir != "" {
			orphans, err := datadir.ListOrphans(vfs.OS, dataDir)
			if err != nil {
				return err
			}
			where := filepath.Join(dataDir, "orphans")
			for _, o := range orphans {
				fmt.Fprintf(w, "%s\t%s\t%d\t%d..%d\t%d\t%s\n", where, o.Name, o.Epoch, o.FirstLSN, o.LastLSN, o.Bytes, o.CutAt.UTC().Format(time.RFC3339))
			}
			return w.Flush()
		}
		d, err := sf.dial(ctx, env.Logger)
		if err != nil {
			return err
		}
		var errs []error
		for _, a := range nodes {
			st, err := nodeStatus(ctx, d, a)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", a, err))
				continue
			}
			where := a
			if st.GetId() != "" {
				where += " (" + st.GetId() + ")"
			}
			for _, o := range st.GetOrphans() {
				fmt.Fprintf(w, "%s\t%s\t%d\t%d..%d\t%d\t%s\n", where, o.GetName(), o.GetEpoch(), o.GetFirstLsn(), o.GetLastLsn(), o.GetBytes(),
					time.Unix(0, o.GetCutTimeUnixNano()).UTC().Format(time.RFC3339))
			}
		}
		if err := w.Flush(); err != nil {
			return err
		}
		return errors.Join(errs...)
	}
}

// orphanWrite is one write of a transaction an orphan file holds.
type orphanWrite struct {
	commitLSN  uint64 // the LSN its writer was given back
	commitTime int64  // the primary's clock at the commit (Unix ns; 0: unknown)
	op         codec.Op
	key        string
	value      []byte
}

// readOrphanWrites decodes the orphan file at path into its writes, in
// LSN order.
func readOrphanWrites(path string) ([]orphanWrite, error) {
	entries, err := datadir.ReadOrphanFile(vfs.OS, path)
	if err != nil {
		return nil, err
	}
	var out []orphanWrite
	for _, e := range entries {
		var env walshipv1.WalBatch
		var b codec.Batch
		if err := envelope.DecodeStored(e.Data, &env, &b); err != nil {
			return nil, fmt.Errorf("%s: entry %d..%d: %w", path, e.FirstLSN, e.LastLSN, err)
		}
		commits := map[uint64]uint64{} // txn id -> commit LSN
		for _, r := range b.Records {
			if r.Op == codec.OpCommit {
				commits[r.TxnID] = r.LSN
			}
		}
		for _, r := range b.Records {
			if r.Op == codec.OpCommit {
				continue
			}
			out = append(out, orphanWrite{commitLSN: commits[r.TxnID], commitTime: env.GetCommitTimeUnixNano(), op: r.Op,
				key: string(r.Key), value: bytes.Clone(r.Value)})
		}
	}
	return out, nil
}

// quoteValue is v for a terminal: Go-quoted, cut after max bytes (0: all).
func quoteValue(v []byte, max int) string {
	if max > 0 && len(v) > max {
		return fmt.Sprintf("%q… (%d bytes)", v[:max], len(v))
	}
	return fmt.Sprintf("%q", v)
}

func ctlOrphansShowFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	var file string
	var maxValue int
	fs.StringVar(&file, "file", "", "path of the orphan file (DATA_DIR/orphans/orphan-e…wal, or a copy) (required)")
	fs.IntVar(&maxValue, "value-bytes", 200, "show at most this many bytes of each value (0 = all)")
	return func(ctx context.Context) error {
		if file == "" {
			return usageErr(env, "--file: required")
		}
		writes, err := readOrphanWrites(file)
		if err != nil {
			return err
		}
		if o, ok := datadir.ParseOrphanName(filepath.Base(file)); ok {
			fmt.Fprintf(env.Stdout, "%s: entries of epoch %d, LSNs %d..%d, cut %s; %d writes\n", filepath.Base(file), o.Epoch, o.FirstLSN, o.LastLSN,
				o.CutAt.UTC().Format(time.RFC3339), len(writes))
		}
		w := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "COMMIT_LSN\tCOMMITTED\tOP\tKEY\tVALUE")
		for _, x := range writes {
			key := fmt.Sprintf("%q", x.key)
			if strings.HasPrefix(x.key, keyspace.ReservedPrefix) {
				key += " (walship's own)"
			}
			val := ""
			if x.op == codec.OpPut {
				val = quoteValue(x.value, maxValue)
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", x.commitLSN, commitTimeOrDash(x.commitTime), x.op, key, val)
		}
		return w.Flush()
	}
}

func commitTimeOrDash(ns int64) string {
	if ns == 0 {
		return "-"
	}
	return time.Unix(0, ns).UTC().Format(time.RFC3339Nano)
}

// errOrphansDiffer is diff's "not the same" (exit 1, as diff(1)).
var errOrphansDiffer = errors.New("the orphan's writes differ from the current state")

func ctlOrphansDiffFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	var file string
	var nodes []string
	var maxValue int
	fs.StringVar(&file, "file", "", "path of the orphan file (DATA_DIR/orphans/orphan-e…wal, or a copy) (required)")
	fs.Var(listFlag{&nodes}, "nodes", "gRPC addresses of the cluster's data nodes, comma-separated: the primary's state is read (required)")
	fs.IntVar(&maxValue, "value-bytes", 60, "show at most this many bytes of each value (0 = all)")
	sf := addSecurityFlags(fs, false)
	return func(ctx context.Context) error {
		if file == "" || len(nodes) == 0 {
			return usageErr(env, "--file and --nodes: required")
		}
		writes, err := readOrphanWrites(file)
		if err != nil {
			return err
		}
		d, err := sf.dial(ctx, env.Logger)
		if err != nil {
			return err
		}
		// Each key's last write in the orphan: what its writer left it at.
		last := map[string]orphanWrite{}
		for _, x := range writes {
			if !strings.HasPrefix(x.key, keyspace.ReservedPrefix) {
				last[x.key] = x
			}
		}
		keys := make([]string, 0, len(last))
		for k := range last {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		cl, err := client.New(nodes, client.Options{DialOptions: d.Options()})
		if err != nil {
			return err
		}
		defer cl.Close()
		w := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "KEY\tORPHAN (commit LSN, committed, write)\tNOW (version LSN, value)\tVERDICT")
		differ := 0
		for _, k := range keys {
			x := last[k]
			g, err := cl.Get(ctx, k)
			if err != nil {
				return fmt.Errorf("read %q on the primary: %w", k, err)
			}
			orphan := "delete"
			if x.op == codec.OpPut {
				orphan = "put " + quoteValue(x.value, maxValue)
			}
			now := "absent"
			if g.GetFound() {
				now = fmt.Sprintf("%d, %s", g.GetVersionLsn(), quoteValue(g.GetValue(), maxValue))
			}
			verdict := "same"
			switch {
			case x.op == codec.OpPut && !g.GetFound():
				verdict = "lost: absent now"
			case x.op == codec.OpPut && !bytes.Equal(g.GetValue(), x.value):
				verdict = "differs"
			case x.op == codec.OpDelete && g.GetFound():
				verdict = "lost delete: present now"
			}
			if verdict != "same" {
				differ++
			}
			fmt.Fprintf(w, "%q\t%d, %s, %s\t%s\t%s\n", k, x.commitLSN, commitTimeOrDash(x.commitTime), orphan, now, verdict)
		}
		if err := w.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(env.Stdout, "%d of %d keys differ from the current state\n", differ, len(keys))
		if differ > 0 {
			return fmt.Errorf("%w: %d of %d keys", errOrphansDiffer, differ, len(keys))
		}
		return nil
	}
}
