package bench

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"google.golang.org/grpc"
)

func TestTPCCMix(t *testing.T) {
	m := newMix((&tpcc{}).kinds(), tpccWeights)
	r := newRand(42, 0)
	const n = 200_000
	counts := make([]int, len(tpccWeights))
	for i := 0; i < n; i++ {
		counts[m.pick(r)]++
	}
	for i, w := range tpccWeights {
		got := float64(counts[i]) / n * 100
		if math.Abs(got-float64(w)) > 0.5 {
			t.Errorf("%s: %.2f%%, want %d%% ± 0.5", m.names[i], got, w)
		}
	}
}

func TestZipfianSkew(t *testing.T) {
	const n, draws = 1000, 200_000
	r := newRand(7, 0)
	z := newZipfian(n, 0.99, false)
	counts := make([]int, n)
	for i := 0; i < draws; i++ {
		v := z.next(r)
		if v < 0 || v >= n {
			t.Fatalf("draw %d out of [0,%d)", v, n)
		}
		counts[v]++
	}
	// P(0) = 1/zeta(n, theta).
	want := 1 / zeta(n, 0.99)
	if got := float64(counts[0]) / draws; math.Abs(got-want) > 0.01 {
		t.Errorf("P(item 0) = %.4f, want %.4f", got, want)
	}
	if !(counts[0] > counts[1] && counts[1] > counts[10] && counts[10] > counts[500]) {
		t.Errorf("not skewed: counts[0,1,10,500] = %d %d %d %d", counts[0], counts[1], counts[10], counts[500])
	}
	// Top 10% of items take well over half the draws.
	sorted := append([]int(nil), counts...)
	sort.Sort(sort.Reverse(sort.IntSlice(sorted)))
	top := 0
	for _, c := range sorted[:n/10] {
		top += c
	}
	if frac := float64(top) / draws; frac < 0.6 {
		t.Errorf("top 10%% of items got %.2f of draws, want > 0.6", frac)
	}
	// Scrambling keeps the skew but moves the hot item away from 0.
	zs := newZipfian(n, 0.99, true)
	sc := make([]int, n)
	for i := 0; i < draws; i++ {
		sc[zs.next(r)]++
	}
	hot := 0
	for i := range sc {
		if sc[i] > sc[hot] {
			hot = i
		}
	}
	if hot == 0 || float64(sc[hot])/draws < want-0.01 {
		t.Errorf("scrambled: hottest item %d with %d draws", hot, sc[hot])
	}
}

func TestNURand(t *testing.T) {
	r := newRand(1, 0)
	for i := 0; i < 10000; i++ {
		if v := nuRand(r, 1023, 259, 1, 300); v < 1 || v > 300 {
			t.Fatalf("NURand out of range: %d", v)
		}
	}
}

func TestRowRoundTrip(t *testing.T) {
	for _, r := range []row{{}, {f: []int64{0}}, {f: []int64{-1, 1 << 40, math.MinInt64, math.MaxInt64}, data: []byte("hello")}} {
		got, err := decodeRow(r.encode(), len(r.f))
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		if fmt.Sprint(got.f) != fmt.Sprint(r.f) && len(r.f) > 0 || !bytes.Equal(got.data, r.data) {
			t.Errorf("round trip: got %+v, want %+v", got, r)
		}
	}
	good := row{f: []int64{1, 2}, data: []byte("x")}.encode()
	for name, b := range map[string][]byte{
		"empty": nil, "wrong count": row{f: []int64{1}}.encode(), "truncated": good[:len(good)-1], "trailing": append(append([]byte(nil), good...), 0),
	} {
		if _, err := decodeRow(b, 2); !errors.Is(err, errRow) {
			t.Errorf("%s: err = %v, want errRow", name, err)
		}
	}
}

func TestTPCCKeys(t *testing.T) {
	cases := []struct {
		key  string
		want tpccKey
	}{
		{wKey(3), tpccKey{table: "warehouse", w: 3}},
		{wYTDKey(3), tpccKey{table: "warehouse_ytd", w: 3}},
		{dKey(3, 7), tpccKey{table: "district", w: 3, d: 7}},
		{dYTDKey(3, 7), tpccKey{table: "district_ytd", w: 3, d: 7}},
		{dNextKey(3, 7), tpccKey{table: "district_next", w: 3, d: 7}},
		{cKey(3, 7, 1234), tpccKey{table: "customer", w: 3, d: 7, c: 1234}},
		{clKey(3, 7, "BARPRIABLE", 12), tpccKey{table: "cust_name", w: 3, d: 7, c: 12, last: "BARPRIABLE"}},
		{hKey(3, "ab12", 4, 99), tpccKey{table: "history", w: 3}},
		{oKey(1, 10, 3001), tpccKey{table: "order", w: 1, d: 10, o: 3001}},
		{coKey(1, 2, 3, 4), tpccKey{table: "cust_order", w: 1, d: 2, c: 3, o: 4}},
		{noKey(1, 2, 2101), tpccKey{table: "new_order", w: 1, d: 2, o: 2101}},
		{olKey(1, 2, 3, 15), tpccKey{table: "order_line", w: 1, d: 2, o: 3, n: 15}},
		{iKey(99999), tpccKey{table: "item", i: 99999}},
		{sKey(2, 100000), tpccKey{table: "stock", w: 2, i: 100000}},
	}
	for _, c := range cases {
		got, err := parseTPCCKey(c.key)
		if err != nil || got != c.want {
			t.Errorf("parse(%q) = %+v, %v; want %+v", c.key, got, err, c.want)
		}
	}
	for _, k := range []string{"", "x/1", "w/abc", "w/0001/d/01/zz/1", "w/0001/d/01/ol/1"} {
		if _, err := parseTPCCKey(k); err == nil {
			t.Errorf("parse(%q): no error", k)
		}
	}
	// Key order is numeric order, so ranges work.
	if !(oKey(1, 1, 9) < oKey(1, 1, 10) && olKey(1, 1, 9, 15) < olKey(1, 1, 10, 1) && noKey(1, 1, 99) < prefixEnd(noPrefix(1, 1))) {
		t.Error("keys do not sort numerically")
	}
	if lastName(371) != "PRICALLYOUGHT" {
		t.Errorf("lastName(371) = %s", lastName(371))
	}
}

// runFake loads w into a fake store and runs terminals transactions on
// each of n concurrent terminals.
func runFake(t *testing.T, w workload, terminals, n int) *fakeKV {
	t.Helper()
	ctx := context.Background()
	f := newFakeKV()
	l := newLoader(ctx, f)
	if err := w.load(l.ctx, l); err != nil {
		t.Fatal(err)
	}
	if _, err := l.finish(ctx); err != nil {
		t.Fatal(err)
	}
	if v := f.check(w.checker()); len(v) > 0 {
		t.Fatalf("inconsistent after load: %v", v)
	}
	var wg sync.WaitGroup
	kinds := make([]int, len(w.kinds()))
	var mu sync.Mutex
	for i := 0; i < terminals; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := &session{kv: f, maxRetries: 100}
			term := w.terminal(i, newRand(3, i))
			for j := 0; j < n; j++ {
				k, err := term.next(ctx, s)
				if err != nil && !errors.Is(err, errRollback) {
					t.Errorf("terminal %d: %v", i, err)
					return
				}
				mu.Lock()
				kinds[k]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for i, c := range kinds {
		if c == 0 {
			t.Errorf("%s never ran", w.kinds()[i])
		}
	}
	return f
}

func smallParams() WorkloadParams {
	return WorkloadParams{Warehouses: 2, Items: 200, Customers: 30, Scale: 2, Accounts: 100, Records: 100, ValueBytes: 20, Theta: 0.99, Seed: 5, PutBytes: 16, RunID: "t", counts: &runCounts{}}
}

func TestTPCCConsistency(t *testing.T) {
	w := newTPCC(smallParams())
	f := runFake(t, w, 4, 150)
	if v := f.check(w.checker()); len(v) > 0 {
		t.Fatalf("inconsistent after the run: %v", v)
	}
	// Break each condition and see it caught.
	breakers := map[string]func(){
		"condition 1": func() {
			r, _ := decodeRow(f.m[wYTDKey(1)].v, 1)
			r.f[ytd]++
			f.set(wYTDKey(1), val{v: r.encode(), found: true})
		},
		"condition 2": func() {
			r, _ := decodeRow(f.m[dNextKey(1, 3)].v, 1)
			r.f[nextOID]++
			f.set(dNextKey(1, 3), val{v: r.encode(), found: true})
		},
		"condition 4": func() { f.remove(olKey(2, 5, 1, 1)) },
		"condition 3": func() {
			kvs, _ := f.Scan(context.Background(), scanReq(noPrefix(2, 4)))
			f.remove(kvs.Kvs[1].Key)
		},
		"malformed": func() { f.set(cKey(1, 1, 1), val{v: []byte{1}, found: true}) },
	}
	for name, brk := range breakers {
		f2 := clone(f)
		brk()
		v := f.check(w.checker())
		if !strings.Contains(strings.Join(v, "\n"), strings.TrimPrefix(name, "malformed")) || len(v) == 0 {
			t.Errorf("%s: violations %q", name, v)
		}
		f = f2
	}
}

func TestTPCBConsistency(t *testing.T) {
	w := newTPCB(smallParams())
	f := runFake(t, w, 4, 200)
	if v := f.check(w.checker()); len(v) > 0 {
		t.Fatalf("inconsistent: %v", v)
	}
	r, _ := decodeRow(f.m[tKey(3)].v, 2)
	r.f[0] += 7
	f.set(tKey(3), val{v: r.encode(), found: true})
	if v := f.check(w.checker()); len(v) != 1 || !strings.Contains(v[0], "sum(tellers)") {
		t.Errorf("broken teller balance: violations %q", v)
	}
}

// TestPutConsistency: after a run every Put the terminals saw commit is
// there with its size; a lost key, a wrong size and a Put not counted are
// each caught; another run's keys are not this run's business.
func TestPutConsistency(t *testing.T) {
	p := smallParams()
	w := newPut(p)
	f := runFake(t, w, 4, 100)
	if p.counts.puts.Load() != 400 {
		t.Fatalf("%d puts counted, want 400", p.counts.puts.Load())
	}
	f.set("put/other-run/00/000000000001", val{v: []byte("x"), found: true})
	if v := f.check(w.checker()); len(v) > 0 {
		t.Fatalf("inconsistent: %v", v)
	}
	for name, brk := range map[string]func(f *fakeKV){
		"puts: 399 keys present": func(f *fakeKV) { f.remove("put/t/02/000000000007") },
		"3 bytes, want 16":       func(f *fakeKV) { f.set("put/t/01/000000000001", val{v: []byte("abc"), found: true}) },
		"puts: 401 keys present": func(f *fakeKV) { f.set("put/t/09/000000000001", val{v: make([]byte, 16), found: true}) },
	} {
		g := clone(f)
		brk(g)
		if v := g.check(w.checker()); !strings.Contains(strings.Join(v, "\n"), name) {
			t.Errorf("%s: violations %q", name, v)
		}
	}
}

// TestPutOverwriteConsistency: with PutKeys, each terminal overwrites
// its share of the keys, and after a run each key holds the value of its
// terminal's last committed Put; a stale value, a lost key, a key no Put
// committed and one of no terminal are each caught.
func TestPutOverwriteConsistency(t *testing.T) {
	p := smallParams()
	p.PutKeys, p.loops = 40, 4
	w := newPut(p)
	f := runFake(t, w, 4, 100)
	keys := 0
	for k := range f.m {
		if strings.HasPrefix(k, w.prefix()) {
			keys++
		}
	}
	if keys == 0 || keys > 40 {
		t.Fatalf("%d keys written by 400 Puts over 40 keys", keys)
	}
	if v := f.check(w.checker()); len(v) > 0 {
		t.Fatalf("inconsistent: %v", v)
	}
	some := ""
	for k := range f.m {
		if strings.HasPrefix(k, w.prefix()+"01/") {
			some = k
			break
		}
	}
	for name, brk := range map[string]func(f *fakeKV){
		"not the value its last committed Put wrote": func(f *fakeKV) { f.set(some, val{v: make([]byte, 16), found: true}) },
		"keys present": func(f *fakeKV) { f.remove(some) },
		"present, but no Put of it committed": func(f *fakeKV) {
			f.set(w.prefix()+"01/000000000999", val{v: make([]byte, 16), found: true})
		},
		"no terminal of this run writes it": func(f *fakeKV) {
			f.set(w.prefix()+"09/000000000001", val{v: make([]byte, 16), found: true})
		},
	} {
		g := clone(f)
		brk(g)
		if v := g.check(w.checker()); !strings.Contains(strings.Join(v, "\n"), name) {
			t.Errorf("%s: violations %q", name, v)
		}
	}
}

func TestYCSBConsistency(t *testing.T) {
	p := smallParams()
	w := newYCSB(p)
	f := runFake(t, w, 4, 300)
	if v := f.check(w.checker()); len(v) > 0 {
		t.Fatalf("inconsistent: %v", v)
	}
	if p.counts.updates.Load() == 0 {
		t.Fatal("no updates counted")
	}
	p.counts.updates.Add(1) // a lost update
	if v := f.check(w.checker()); len(v) != 1 || !strings.Contains(v[0], "updates") {
		t.Errorf("lost update: violations %q", v)
	}
	f.remove(yKey(0))
	if v := f.check(w.checker()); !strings.Contains(strings.Join(v, " "), "records: 99 present") {
		t.Errorf("missing record: violations %q", v)
	}
}

// TestConflictRetries checks the optimistic loop: a transaction whose read
// is overwritten before it commits retries with the fresh value.
func TestConflictRetries(t *testing.T) {
	ctx := context.Background()
	f := newFakeKV()
	f.Put(ctx, putReq("k", row{f: []int64{0}}.encode()))
	s := &session{kv: f, maxRetries: 3}
	calls := 0
	err := s.run(ctx, readWrite, func(ctx context.Context, tx *tx) error {
		vs, err := tx.get(ctx, "k")
		if err != nil {
			return err
		}
		r, _ := decodeRow(vs[0].v, 1)
		if calls++; calls == 1 { // someone else commits in between
			f.Put(ctx, putReq("k", row{f: []int64{10}}.encode()))
		}
		tx.put("k", row{f: []int64{r.f[0] + 1}}.encode())
		return nil
	})
	if err != nil || calls != 2 || s.retries.Load() != 1 {
		t.Fatalf("err %v, calls %d, retries %d", err, calls, s.retries.Load())
	}
	if r, _ := decodeRow(f.m["k"].v, 1); r.f[0] != 11 {
		t.Errorf("k = %d, want 11", r.f[0])
	}
	// Always conflicting: aborts after maxRetries.
	err = s.run(ctx, readWrite, func(ctx context.Context, tx *tx) error {
		if _, err := tx.get(ctx, "k"); err != nil {
			return err
		}
		f.Put(ctx, putReq("k", row{f: []int64{0}}.encode()))
		tx.put("k", nil)
		return nil
	})
	if !errors.Is(err, errAborted) {
		t.Errorf("err = %v, want errAborted", err)
	}
}

// speculativeLog is a fakeKV that records each Txn's speculative flag.
type speculativeLog struct {
	*fakeKV
	flags []bool
}

func (l *speculativeLog) Txn(ctx context.Context, req *walshipv1.TxnRequest, opts ...grpc.CallOption) (*walshipv1.TxnResponse, error) {
	l.flags = append(l.flags, req.Speculative)
	return l.fakeKV.Txn(ctx, req, opts...)
}

// TestSpeculativeOnlyForReadWrite: with speculative reads on, a read-write
// transaction's read and commit ask for them; read-only transactions never
// do (their reads are results), validated or not; with them off, nothing
// does.
func TestSpeculativeOnlyForReadWrite(t *testing.T) {
	ctx := context.Background()
	for _, on := range []bool{true, false} {
		l := &speculativeLog{fakeKV: newFakeKV()}
		l.Put(ctx, putReq("k", row{f: []int64{0}}.encode()))
		s := &session{kv: l, maxRetries: 3, speculative: on}
		for _, tc := range []struct {
			kind txnKind
			want []bool // read, then commit or validation
		}{
			{readWrite, []bool{on, on}},
			{readOnly, []bool{false}},
			{readOnlyValidated, []bool{false, false}},
		} {
			l.flags = nil
			err := s.run(ctx, tc.kind, func(ctx context.Context, tx *tx) error {
				if _, err := tx.get(ctx, "k"); err != nil {
					return err
				}
				if tc.kind == readWrite {
					tx.put("k", row{f: []int64{1}}.encode())
				}
				return nil
			})
			if err != nil || !slices.Equal(l.flags, tc.want) {
				t.Errorf("speculative=%v, kind %d: Txn flags %v, err %v; want %v", on, tc.kind, l.flags, err, tc.want)
			}
		}
	}
}

func sampleRows() []Row {
	var rows []Row
	for _, c := range []string{"msgpack", "json"} {
		for i, cell := range MatrixCells {
			rep, dur := title(cell[0]), title(cell[1])
			rows = append(rows, Row{Workload: "tpcc", Codec: c, Replication: rep, Durability: dur, Terminals: 8, DurationS: 20,
				TxnPerS: float64(100 * (i + 1)), P50Ms: 1.5, P99Ms: 9.25, Commits: 2000, Consistent: true, Mode: ModeInProcess, Replicas: 2,
				Nodes: []NodeCheck{{Node: "primary", VisibleLSN: 9, Digest: "ab"}}})
		}
	}
	return rows
}

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	rows := sampleRows()
	rows[0].CPUMsPer1000 = 1234.4 // the others: not measured
	rows[0].CPUCores = 1.734
	rows[0].CommitsPerBatch, rows[0].FsyncMs = 4.26, 0.734
	if err := WriteTable(&b, rows); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"TPCC, msgpack, 8 terminals", "Replication  Durability  Reqs per second", "vs Disabled/Sync",
		"WAL MB/s  txn/batch  fsync ms  CPU ms/1k commits  CPU cores  consistent", "0.00        4.3      0.73               1234       1.73        true",
		"0.00          -         -                  -          -        true",
		"TPCC codec gap", "msgpack/json"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	// Replication, Durability, Reqs per second, rounds, vs Disabled/Sync.
	for cell, want := range map[string]string{"Sync Sync": "100.0 - 0.20x", "Disabled Sync": "500.0 - 1.00x"} {
		if got := tableRow(out, cell, 3); got != want {
			t.Errorf("%s: %q, want %q:\n%s", cell, got, want, out)
		}
	}
	// The seed's row order: Sync/Sync first, Disabled/Async last.
	if strings.Index(out, "Sync        Sync") > strings.Index(out, "Disabled       Async") {
		t.Errorf("rows out of order:\n%s", out)
	}
}

func TestJSONRoundTrip(t *testing.T) {
	rows := sampleRows()
	rows[0].Notes, rows[0].Runs = "note", []float64{1, 2, 3}
	var b bytes.Buffer
	if err := WriteJSON(&b, rows); err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{`"workload"`, `"codec"`, `"replication"`, `"durability"`, `"sync_replicas"`, `"sync_level"`, `"terminals"`, `"duration_s"`,
		`"txn_per_s"`, `"p50_ms"`, `"p99_ms"`, `"commits"`, `"aborts"`, `"retries"`, `"replica_lag_p99_s"`, `"wal_mb_per_s"`, `"consistent"`, `"notes"`} {
		if !strings.Contains(b.String(), field) {
			t.Errorf("JSON lacks %s", field)
		}
	}
	got, err := ReadJSON(&b)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", rows) {
		t.Errorf("round trip differs:\n%+v\n%+v", got, rows)
	}
}

func TestWriteSVG(t *testing.T) {
	rows := append(sampleRows(), Row{Workload: "tpcb", Codec: "json", Replication: "Async", Durability: "Sync", TxnPerS: 1234.5})
	var b bytes.Buffer
	if err := WriteSVG(&b, rows); err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(&b)
	rects, texts := 0, 0
	var root string
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
				if se.Name.Space != "http://www.w3.org/2000/svg" {
					t.Errorf("namespace %q", se.Name.Space)
				}
			}
			switch se.Name.Local {
			case "rect":
				rects++
			case "text":
				texts++
			}
		}
	}
	// Background + 13 bars + 2 legends × 2 panels.
	if root != "svg" || rects != 1+13+4 || texts < 20 {
		t.Errorf("root %q, %d rects, %d texts", root, rects, texts)
	}
}

func TestParseProcStat(t *testing.T) {
	// pid (comm with spaces) state ppid ... utime=field 14, stime=field 15.
	s := "1234 (wal ship) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0"
	got, err := parseProcStat(s)
	if err != nil || got != 3*time.Second {
		t.Errorf("got %v, %v; want 3s", got, err)
	}
	if _, err := parseProcStat("garbage"); err == nil {
		t.Error("no error for garbage")
	}
}

func TestParseProcIO(t *testing.T) {
	s := "rchar: 12345\nwchar: 678\nsyscr: 42\nsyscw: 17\nread_bytes: 0\nwrite_bytes: 4096\ncancelled_write_bytes: 0\n"
	r, w, err := parseProcIO(s)
	if err != nil || r != 42 || w != 17 {
		t.Errorf("got %d, %d, %v; want 42, 17", r, w, err)
	}
	for _, bad := range []string{"rchar: 1\n", "syscr: 1\n", "syscr: x\nsyscw: 1\n"} {
		if _, _, err := parseProcIO(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestProcSyscallsCounts: the write system calls this process makes show
// in its count, as the bench reads the primary's.
func TestProcSyscallsCounts(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc/<pid>/io is Linux's")
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "w"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r0, w0, err := procSyscalls(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	for range n {
		if _, err := f.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.ReadAt(make([]byte, 1), 0); err != nil {
		t.Fatal(err)
	}
	r1, w1, err := procSyscalls(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if w1-w0 < n || r1-r0 < 1 {
		t.Errorf("%d writes and a read made %d write and %d read system calls", n, w1-w0, r1-r0)
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	if p := percentile(ds, 0.5); p != 50*time.Millisecond {
		t.Errorf("p50 = %v", p)
	}
	if p := percentile(ds, 0.99); p != 99*time.Millisecond {
		t.Errorf("p99 = %v", p)
	}
	if percentile(nil, 0.5) != 0 {
		t.Error("empty")
	}
}

// TestRatioPairsRounds: with rounds, a cell's ratio to another is the
// median of the per-round ratios, not the ratio of the medians — a round in
// which the whole machine was slow moves both runs of it together.
func TestRatioPairsRounds(t *testing.T) {
	base := Row{TxnPerS: 150, Runs: []float64{100, 200, 150}}
	cell := Row{TxnPerS: 95, Runs: []float64{95, 190, 60}} // ratios 0.95, 0.95, 0.40
	for _, tc := range []struct {
		name   string
		r, b   Row
		want   float64
		wantOK bool
	}{
		{"paired", cell, base, 0.95, true},
		{"even rounds", Row{Runs: []float64{90, 200, 60, 80}}, Row{Runs: []float64{100, 200, 100, 100}}, 0.85, true},
		{"single runs", Row{TxnPerS: 50}, Row{TxnPerS: 200}, 0.25, true},
		{"unequal rounds", Row{TxnPerS: 95, Runs: []float64{95, 60}}, base, 95.0 / 150, true},
		{"no base", cell, Row{}, 0, false},
		{"a base round without throughput", cell, Row{TxnPerS: 150, Runs: []float64{100, 0, 150}}, 0, false},
	} {
		got, ok := Ratio(tc.r, tc.b)
		if ok != tc.wantOK || math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: Ratio = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.wantOK)
		}
	}
}

// TestWriteTableRounds: a matrix of rounds says so, shows each cell's
// range, and its ratios are paired by round (the codec gap too).
func TestWriteTableRounds(t *testing.T) {
	rows := sampleRows()
	for i := range rows {
		r := &rows[i]
		r.Runs = []float64{r.TxnPerS, r.TxnPerS * 2, r.TxnPerS / 2}
	}
	// Per round, Sync/Sync msgpack ran at 0.2, 0.5 and 0.36 of
	// Disabled/Sync: 0.36 paired, where the medians' ratio is 100/500.
	ds, ss := &rows[4], &rows[0]
	ds.Runs = []float64{500, 2000, 250}
	ss.Runs = []float64{100, 1000, 90}
	var b bytes.Buffer
	if err := WriteTable(&b, rows); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.Contains(out, "medians of 3 rounds, ratios paired by round") || !strings.Contains(out, "Reqs per second    rounds  vs Disabled/Sync") {
		t.Errorf("table does not say it holds rounds:\n%s", out)
	}
	for cell, want := range map[string]string{"Sync Sync": "100.0 90-1000 0.36x", "Disabled Sync": "500.0 250-2000 1.00x",
		"Sync Sync 100.0 100.0": "1.80x"} { // the codec gap: 100/100, 1000/200, 90/50
		if got := tableRow(out, cell, 3); got != want {
			t.Errorf("%s: %q, want %q:\n%s", cell, got, want, out)
		}
	}
}

// tableRow returns the n fields after the first line of out whose fields
// start with prefix (fields separated by single spaces), "" if none does.
func tableRow(out, prefix string, n int) string {
	p := strings.Fields(prefix)
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= len(p) && slices.Equal(f[:len(p)], p) {
			return strings.Join(f[len(p):min(len(f), len(p)+n)], " ")
		}
	}
	return ""
}

// TestCPULists: CPU lists fold into ranges and parse back; malformed
// lists are refused naming the part.
func TestCPULists(t *testing.T) {
	for _, tc := range []struct {
		cpus []int
		list string
	}{
		{[]int{0}, "0"},
		{[]int{1, 2, 3}, "1-3"},
		{[]int{0, 2, 3, 5}, "0,2-3,5"},
	} {
		if got := cpuListOf(tc.cpus); got != tc.list {
			t.Errorf("cpuListOf(%v) = %q, want %q", tc.cpus, got, tc.list)
		}
		set, err := parseCPUList(tc.list)
		if err != nil {
			t.Fatal(err)
		}
		if set.Count() != len(tc.cpus) {
			t.Errorf("parseCPUList(%q) has %d CPUs, want %d", tc.list, set.Count(), len(tc.cpus))
		}
		for _, c := range tc.cpus {
			if !set.IsSet(c) {
				t.Errorf("parseCPUList(%q) lacks CPU %d", tc.list, c)
			}
		}
	}
	for _, bad := range []string{"", "a", "3-1", "1,", "99999"} {
		if _, err := parseCPUList(bad); err == nil {
			t.Errorf("parseCPUList(%q) accepted", bad)
		}
	}
}

// TestPinSelf pins this test process to one CPU it may use and reads
// every thread's allowed CPUs back, then restores them.
func TestPinSelf(t *testing.T) {
	primaryCPUs, _, err := SplitCPUs()
	if err != nil {
		t.Skipf("this test needs two CPUs to pin to one: %v", err)
	}
	own := cpusAllowed(t, "/proc/self/status")
	t.Cleanup(func() {
		if err := PinSelf(own); err != nil {
			t.Fatal(err)
		}
	})
	if err := PinSelf(primaryCPUs); err != nil {
		t.Fatal(err)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if got := cpusAllowed(t, "/proc/self/task/"+task.Name()+"/status"); got != "" && got != primaryCPUs {
			t.Errorf("thread %s may run on CPUs %s, want %s", task.Name(), got, primaryCPUs)
		}
	}
}

// TestPlacedAs: a table's title says where the nodes ran.
func TestPlacedAs(t *testing.T) {
	for _, tc := range []struct {
		row  Row
		want string
	}{
		{Row{Mode: ModeInProcess}, " (every node and the clients on the same cores)"},
		{Row{Mode: ModeProcesses}, " (every node and the clients on the same cores)"},
		{Row{Mode: ModeExternal}, ""},
		{Row{Mode: ModeProcesses, PrimaryCPUs: "0", ReplicaCPUs: "1"}, " (primary and clients on CPUs 0; log store and replicas on CPUs 1)"},
		{Row{Mode: ModeProcesses, ReplicaIdle: true}, " (log store and replicas at SCHED_IDLE)"},
		{Row{Mode: ModeProcesses, ReplicaNice: 5, ReplicaCPUs: "2-3"}, " (log store and replicas at nice 5, on CPUs 2-3)"},
	} {
		if got := placedAs(tc.row); got != tc.want {
			t.Errorf("placedAs(%+v) = %q, want %q", tc.row, got, tc.want)
		}
	}
}
