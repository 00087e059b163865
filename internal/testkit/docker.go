package testkit

// Tests that need hosts of their own run walship as Docker containers: an
// image FROM scratch around a static binary (no image can be pulled here),
// networks the test creates and cuts, and cleanup that also finds what a
// killed run left behind.
//
// Every object a DockerRun creates carries labels: the run's id, the test
// process's pid, and where that pid means something — the host and its boot
// (hostname and boot id) and the PID namespace. Cleanup removes the run's
// objects; NewDockerRun first sweeps the objects of runs whose process is
// gone (go test -timeout, SIGKILL), but only runs of this host's boot and
// this PID namespace: on a Docker engine shared by several hosts or
// containers, a pid that does not exist here may be a live test elsewhere.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Labels on every object a DockerRun creates.
const (
	labelRun = "io.walship.test.run"
	labelPID = "io.walship.test.pid"
	// labelHost is "hostname/boot id" and labelPIDNS the inode of the PID
	// namespace: a pid is checked only where it was taken.
	labelHost  = "io.walship.test.host"
	labelPIDNS = "io.walship.test.pidns"
)

// origin is where a test process's pid means something: the host, its
// boot, and the PID namespace. The inode alone is not enough: every host's
// initial PID namespace has the same one.
type origin struct {
	host  string // hostname + "/" + /proc/sys/kernel/random/boot_id
	pidns string // the inode of /proc/self/ns/pid
}

// selfOrigin is this process's origin; its fields are "" where the system
// does not say (not Linux), and then no run is ever swept.
func selfOrigin() origin {
	var o origin
	host, herr := os.Hostname()
	boot, berr := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if herr == nil && berr == nil && host != "" && len(strings.TrimSpace(string(boot))) > 0 {
		o.host = host + "/" + strings.TrimSpace(string(boot))
	}
	// "pid:[4026531836]"
	if ns, err := os.Readlink("/proc/self/ns/pid"); err == nil {
		if inode, ok := strings.CutPrefix(ns, "pid:["); ok {
			o.pidns = strings.TrimSuffix(inode, "]")
		}
	}
	return o
}

// abandoned reports whether a run whose objects carry these labels was
// started by a process of self's host, boot and PID namespace that is gone
// (alive says whether a pid exists here). Objects without the host and
// namespace labels, or with another's, are never swept: their pid means
// nothing here.
func abandoned(self origin, host, pidns, pid string, alive func(int) bool) bool {
	if self.host == "" || self.pidns == "" || host != self.host || pidns != self.pidns {
		return false
	}
	n, err := strconv.Atoi(pid)
	if err != nil || n <= 0 || n == os.Getpid() {
		return false
	}
	return !alive(n)
}

// pidAlive says whether pid exists in this PID namespace.
func pidAlive(pid int) bool { return !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) }

// scratchDockerfile is the test image: the static binary and a /data the
// unprivileged user owns — the same as `make image` builds.
const scratchDockerfile = `FROM scratch
COPY walship /walship
COPY --chown=65532:65532 data /data
USER 65532:65532
ENTRYPOINT ["/walship"]
`

// NeedDocker skips t when no Docker engine is usable.
func NeedDocker(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("skipping: the docker CLI is not on PATH (the test runs walship as containers)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		t.Skipf("skipping: `docker info` failed, no Docker engine reachable: %v: %s", err, strings.TrimSpace(string(out)))
	}
}

// DockerRun is one test's set of Docker objects.
type DockerRun struct {
	t  testing.TB
	ID string // unique suffix of every name
}

// NewDockerRun starts a run: it sweeps abandoned runs and removes this
// run's objects when the test ends.
func NewDockerRun(t testing.TB) *DockerRun {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	r := &DockerRun{t: t, ID: hex.EncodeToString(b[:])}
	sweepAbandoned(t)
	t.Cleanup(func() {
		for _, err := range removeByLabel(labelRun+"="+r.ID, 30*time.Second) {
			t.Errorf("cleanup: %v", err)
		}
	})
	return r
}

// Labels are the docker flags that label an object as this run's.
func (r *DockerRun) Labels() []string {
	o := selfOrigin()
	return []string{"--label", labelRun + "=" + r.ID, "--label", labelPID + "=" + strconv.Itoa(os.Getpid()),
		"--label", labelHost + "=" + o.host, "--label", labelPIDNS + "=" + o.pidns}
}

// docker runs the docker CLI and returns its trimmed output.
func docker(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

// Must runs docker and fails the test on an error.
func (r *DockerRun) Must(args ...string) string {
	r.t.Helper()
	out, err := docker(2*time.Minute, args...)
	if err != nil {
		r.t.Fatal(err)
	}
	return out
}

// Image builds the scratch image around cmd/walship built statically, and
// returns its tag; the run's cleanup removes it.
func (r *DockerRun) Image() string {
	r.t.Helper()
	dir := r.t.TempDir()
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, "walship"), "github.com/walship/walship/cmd/walship")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		r.t.Fatalf("go build: %v\n%s", err, out)
	}
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(scratchDockerfile), 0o644); err != nil {
		r.t.Fatal(err)
	}
	tag := "walship-test-" + r.ID + ":test"
	r.Must(append(append([]string{"build", "-q"}, r.Labels()...), "-t", tag, dir)...)
	return tag
}

// Network creates a bridge network of the run and returns its name.
func (r *DockerRun) Network(name string) string {
	r.t.Helper()
	full := "walship-test-" + r.ID + "-" + name
	r.Must(append(append([]string{"network", "create"}, r.Labels()...), full)...)
	return full
}

// IP is the address of container on network.
func (r *DockerRun) IP(container, network string) string {
	r.t.Helper()
	ip := r.Must("inspect", "--format", `{{(index .NetworkSettings.Networks "`+network+`").IPAddress}}`, container)
	if ip == "" {
		r.t.Fatalf("container %s has no address on %s", container, network)
	}
	return ip
}

// DockerLogs returns the last lines of a container's log, for a failure
// report.
func DockerLogs(container string, lines int) string {
	out, err := docker(time.Minute, "logs", "--tail", strconv.Itoa(lines), container)
	if err != nil {
		return err.Error()
	}
	return out
}

// removeByLabel removes every container, network, volume and image that
// carries the label filter, retrying a network's removal for up to
// patience. Containers are stopped and detached from
// their networks first, one network at a time after: removing a running
// container that a network connect or disconnect touched can leave the
// engine with a stale endpoint that keeps the network.
func removeByLabel(filter string, patience time.Duration) []error {
	var errs []error
	list := func(args ...string) []string {
		out, err := docker(time.Minute, append(args, "--filter", "label="+filter)...)
		if err != nil {
			errs = append(errs, err)
			return nil
		}
		return strings.Fields(out)
	}
	containers, networks := list("ps", "-aq"), list("network", "ls", "-q")
	if len(containers) > 0 {
		_, _ = docker(2*time.Minute, append([]string{"kill"}, containers...)...) // some may have exited
		for _, n := range networks {
			for _, c := range containers {
				_, _ = docker(time.Minute, "network", "disconnect", "-f", n, c) // not every container is on every network
			}
		}
		if _, err := docker(2*time.Minute, append([]string{"rm", "-f", "-v"}, containers...)...); err != nil {
			errs = append(errs, err)
		}
	}
	for _, n := range networks {
		// A network can outlive its removed containers by a moment ("has
		// active endpoints"): retry until the engine lets it go.
		deadline := time.Now().Add(patience)
		for {
			_, err := docker(time.Minute, "network", "rm", n)
			if err == nil {
				break
			}
			if !strings.Contains(err.Error(), "active endpoints") || time.Now().After(deadline) {
				errs = append(errs, err)
				break
			}
			<-time.After(200 * time.Millisecond)
		}
	}
	if vs := list("volume", "ls", "-q"); len(vs) > 0 {
		if _, err := docker(time.Minute, append([]string{"volume", "rm", "-f"}, vs...)...); err != nil {
			errs = append(errs, err)
		}
	}
	if is := list("image", "ls", "-q"); len(is) > 0 {
		if _, err := docker(time.Minute, append([]string{"rmi", "-f"}, is...)...); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// sweepAbandoned removes the objects of runs whose test process is gone:
// runs of this host's boot and PID namespace only (abandoned).
func sweepAbandoned(t testing.TB) {
	self := selfOrigin()
	if self.host == "" || self.pidns == "" {
		return
	}
	seen := map[string]bool{}
	var fields []string
	for _, l := range []string{labelRun, labelPID, labelHost, labelPIDNS} {
		fields = append(fields, `{{.Label "`+l+`"}}`)
	}
	format := strings.Join(fields, "\t")
	for _, list := range [][]string{{"ps", "-a"}, {"network", "ls"}} {
		out, err := docker(time.Minute, append(list, "--filter", "label="+labelPID, "--format", format)...)
		if err != nil || out == "" {
			continue
		}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Split(line, "\t")
			if len(f) != 4 || f[0] == "" || seen[f[0]] || !abandoned(self, f[2], f[3], f[1], pidAlive) {
				continue
			}
			seen[f[0]] = true
			t.Logf("removing Docker objects of an abandoned run %s (pid %s, gone from this host's PID namespace)", f[0], f[1])
			for _, err := range removeByLabel(labelRun+"="+f[0], 0) {
				t.Logf("  %v", err)
			}
		}
	}
}
