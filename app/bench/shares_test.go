package bench

import (
	"bytes"
	"math"
	"testing"

	"github.com/google/pprof/profile"
)

// TestCPUShares builds a CPU profile whose stacks each belong to one owner
// and checks how cpuShares splits it: by the innermost frame of an owner,
// so the runtime's malloc under gRPC is gRPC's and under walship
// walship's.
func TestCPUShares(t *testing.T) {
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		PeriodType: &profile.ValueType{Type: "cpu", Unit: "nanoseconds"},
		Period:     10_000_000,
	}
	fn := map[string]*profile.Location{}
	loc := func(name string) *profile.Location {
		if l, ok := fn[name]; ok {
			return l
		}
		f := &profile.Function{ID: uint64(len(p.Function) + 1), Name: name}
		p.Function = append(p.Function, f)
		l := &profile.Location{ID: uint64(len(p.Location) + 1), Line: []profile.Line{{Function: f}}}
		p.Location = append(p.Location, l)
		fn[name] = l
		return l
	}
	sample := func(ms int64, stack ...string) {
		s := &profile.Sample{Value: []int64{ms / 10, ms * 1_000_000}}
		for _, name := range stack { // leaf first
			s.Location = append(s.Location, loc(name))
		}
		p.Sample = append(p.Sample, s)
	}
	sample(300, "runtime.mallocgc", "github.com/walship/walship/internal/state.(*Store).Apply", "github.com/walship/walship/services/primary.(*pipeline).resolve")
	sample(200, "internal/runtime/syscall/linux.Syscall6", "syscall.write", "google.golang.org/grpc/internal/transport.(*loopyWriter).run")
	sample(100, "runtime.mallocgc", "google.golang.org/protobuf/internal/impl.(*MessageInfo).unmarshalPointer", "github.com/walship/walship/internal/serve.checkedCodec.Unmarshal")
	sample(150, "internal/runtime/syscall/linux.Syscall6", "golang.org/x/sys/unix.Fdatasync", "github.com/walship/walship/internal/wal.(*Log).Sync")
	sample(120, "runtime.scanobject", "runtime.gcDrain", "runtime.gcBgMarkWorker")
	sample(80, "runtime.findRunnable", "runtime.schedule")
	sample(50, "compress/gzip.(*Writer).Write", "github.com/prometheus/client_golang/prometheus/promhttp.HandlerFor")
	var buf bytes.Buffer
	if err := p.Write(&buf); err != nil {
		t.Fatal(err)
	}
	got, err := cpuShares(&buf)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{ownerWalship: 0.3, ownerGRPC: 0.3, ownerFsync: 0.15, ownerGC: 0.12, ownerRuntime: 0.08, ownerOther: 0.05}
	for k, w := range want {
		if math.Abs(got[k]-w) > 1e-9 {
			t.Errorf("%s: %.3f, want %.3f (all: %v)", k, got[k], w, got)
		}
	}
	if s := formatShares(got); s != "walship 30%, grpc 30%, fsync 15%, gc 12%, runtime 8%, other 5%" {
		t.Errorf("formatShares = %q", s)
	}
	if _, err := cpuShares(bytes.NewReader([]byte("not a profile"))); err == nil {
		t.Error("a file that is no profile parsed")
	}
}
