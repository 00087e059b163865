package bench

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/google/pprof/profile"
)

// Owners of a profile's CPU time, as cpuShares splits it.
const (
	ownerWalship = "walship" // walship's own code (and the libraries it calls: btree, msgpack)
	ownerGRPC    = "grpc"    // gRPC, HTTP/2 and protobuf, with the socket reads and writes they make
	ownerFsync   = "fsync"   // the WAL's fdatasync calls
	ownerGC      = "gc"      // the garbage collector's background work
	ownerRuntime = "runtime" // scheduling, timers, and what no owner above called
	ownerOther   = "other"   // anything else (the metrics endpoint, the profiler)
)

// shareOrder is the order the shares are printed in.
var shareOrder = []string{ownerWalship, ownerGRPC, ownerFsync, ownerGC, ownerRuntime, ownerOther}

// cpuShares reads a CPU profile and splits its samples by owner: each
// sample goes to the innermost frame of its stack that belongs to an
// owner, so that an allocation or a syscall counts for whoever made it —
// a socket write for gRPC, an fdatasync for fsync, a map lookup for
// walship. The result adds up to 1 (empty for a profile with no samples).
func cpuShares(r io.Reader) (map[string]float64, error) {
	p, err := profile.Parse(r)
	if err != nil {
		return nil, err
	}
	vi := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" {
			vi = i
		}
	}
	if vi < 0 {
		return nil, fmt.Errorf("not a CPU profile: sample types %v", p.SampleType)
	}
	sums := map[string]float64{}
	total := 0.0
	for _, s := range p.Sample {
		v := float64(s.Value[vi])
		sums[ownerOf(s)] += v
		total += v
	}
	if total == 0 {
		return map[string]float64{}, nil
	}
	for k := range sums {
		sums[k] /= total
	}
	return sums, nil
}

// profileShares reads the profile at path with cpuShares.
func profileShares(path string) (map[string]float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return cpuShares(f)
}

// ownerOf walks a sample's stack from the leaf up.
func ownerOf(s *profile.Sample) string {
	for _, loc := range s.Location {
		// Inlined functions come first in a location's lines.
		for _, line := range loc.Line {
			if line.Function == nil {
				continue
			}
			switch name := line.Function.Name; {
			case strings.Contains(name, "Fdatasync"), strings.Contains(name, "vfs.fdatasync"):
				return ownerFsync
			case strings.HasPrefix(name, "github.com/walship/walship/"),
				strings.HasPrefix(name, "github.com/google/btree"),
				strings.HasPrefix(name, "github.com/vmihailenco/msgpack"):
				if strings.HasPrefix(name, "github.com/walship/walship/gen/") {
					return ownerGRPC // generated handlers and message code
				}
				if strings.HasPrefix(name, "github.com/walship/walship/internal/serve.checkedCodec") {
					return ownerGRPC // the codec: protobuf, and what it refused
				}
				return ownerWalship
			case strings.HasPrefix(name, "google.golang.org/grpc"),
				strings.HasPrefix(name, "golang.org/x/net/http2"),
				strings.HasPrefix(name, "google.golang.org/protobuf"):
				return ownerGRPC
			case strings.HasPrefix(name, "runtime.gcBgMarkWorker"), strings.HasPrefix(name, "runtime.bgsweep"),
				strings.HasPrefix(name, "runtime.bgscavenge"):
				return ownerGC
			case strings.HasPrefix(name, "net/http."), strings.HasPrefix(name, "github.com/prometheus/"),
				strings.HasPrefix(name, "runtime/pprof."):
				return ownerOther
			}
		}
	}
	return ownerRuntime
}

// formatShares writes shares in shareOrder as "walship 23%, grpc 41%, ...".
func formatShares(shares map[string]float64) string {
	var parts []string
	for _, k := range shareOrder {
		if v, ok := shares[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %.0f%%", k, 100*v))
		}
	}
	return strings.Join(parts, ", ")
}
