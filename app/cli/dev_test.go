package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/s3test"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/pkg/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// devRun is `walship dev` running in the background.
type devRun struct {
	out, errOut *testkit.Output
	cancel      context.CancelFunc
	code        chan int
}

// startDev runs `walship dev args...` until the test ends, and returns
// once it printed that the cluster is up.
func startDev(t *testing.T, args ...string) *devRun {
	t.Helper()
	// Made before the cleanup that stops dev is registered, so that it is
	// removed after dev stopped.
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	d := &devRun{out: &testkit.Output{}, errOut: &testkit.Output{}, cancel: cancel, code: make(chan int, 1)}
	go func() {
		d.code <- Main(ctx, append([]string{"dev", "--base-port", "0", "--data-dir", dir}, args...), d.out, d.errOut)
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-d.code; code != 0 {
			t.Errorf("walship dev exit %d\nstderr:\n%s", code, d.errOut.String())
		}
	})
	testkit.UntilWithin(t, time.Minute, "walship dev to print its hints", func() bool {
		select {
		case code := <-d.code:
			t.Fatalf("walship dev exit %d\nstdout:\n%s\nstderr:\n%s", code, d.out.String(), d.errOut.String())
		default:
		}
		return strings.Contains(d.out.String(), "Check that it is linearizable")
	})
	return d
}

// node is the gRPC address of node name in dev's table.
func (d *devRun) node(t *testing.T, name string) string {
	t.Helper()
	for _, line := range strings.Split(d.out.String(), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == name {
			return f[1]
		}
	}
	t.Fatalf("no node %s in:\n%s", name, d.out.String())
	return ""
}

// hint is the argument list of the printed command line that starts with
// prefix ("walship restore"), without "walship".
func (d *devRun) hint(t *testing.T, prefix string) []string {
	t.Helper()
	return hintIn(t, d.out.String(), prefix)
}

// hintIn is the argument list of the command line in out that starts
// with prefix, without "walship".
func hintIn(t *testing.T, out, prefix string) []string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		// The command may follow a label on its line ("Start it: walship ...").
		if i := strings.Index(line, prefix+" "); i >= 0 {
			line = line[i:]
			if i := strings.Index(line, "  #"); i > 0 {
				line = line[:i]
			}
			f := strings.Fields(line)
			for i, a := range f {
				if a == "''" {
					f[i] = ""
				} else if strings.ContainsAny(a, `'"`) {
					t.Fatalf("the hint %q quotes an argument; the test splits on spaces", line)
				}
			}
			return f[1:]
		}
	}
	t.Fatalf("no hint %q in:\n%s", prefix, out)
	return nil
}

// flagValue is the value of --name in args (a hint's argument list).
func flagValue(t *testing.T, args []string, name string) string {
	t.Helper()
	for i, a := range args {
		if a == "--"+name && i+1 < len(args) {
			return args[i+1]
		}
	}
	t.Fatalf("no --%s in %q", name, args)
	return ""
}

func devConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// TestDevArchive: `walship dev --archive` gives the archive to every log
// store, the primary has one of them upload, and the commands it prints —
// verify, then restore — work as printed against what was written: the
// restore reaches the primary's LSN and state digest. With an encrypted
// directory (the key file in the hints) and with a SeaweedFS bucket (its
// endpoint and path style in the hints).
func TestDevArchive(t *testing.T) {
	for _, kind := range []string{"file", "s3"} {
		t.Run(kind, func(t *testing.T) {
			// Encrypted: the printed commands work only if they carry the key.
			keys := filepath.Join(t.TempDir(), "archive.keys")
			if err := os.WriteFile(keys, []byte("k1 "+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			args := []string{"--archive", "file://" + filepath.Join(t.TempDir(), "archive"), "--archive-key-file", keys}
			if kind == "s3" {
				srv := s3test.Start(t, "walship")
				for _, kv := range srv.Env() {
					k, v, _ := strings.Cut(kv, "=")
					t.Setenv(k, v)
				}
				args = []string{"--archive", "s3://walship/dev", "--archive-endpoint", srv.Endpoint, "--archive-path-style"}
			}
			d := startDev(t, append([]string{"--logstores", "3", "--replicas", "1"}, args...)...)
			out := d.out.String()
			if !strings.Contains(out, "Archive: every log store has "+args[1]) {
				t.Fatalf("no archive section:\n%s", out)
			}
			ctx := t.Context()
			pc := devConn(t, d.node(t, "primary"))
			var last uint64
			for i := range 20 {
				r, err := walshipv1.NewKVServiceClient(pc).Put(ctx, &walshipv1.PutRequest{Key: fmt.Sprintf("k%d", i%7), Value: []byte(fmt.Sprint(i))})
				if err != nil {
					t.Fatal(err)
				}
				last = r.Lsn
			}
			var st *walshipv1.StatusResponse
			testkit.UntilWithin(t, 30*time.Second, fmt.Sprintf("the archive to hold LSN %d", last), func() bool {
				var err error
				st, err = walshipv1.NewAdminServiceClient(pc).Status(ctx, &walshipv1.StatusRequest{})
				return err == nil && st.GetArchive().GetArchivedLsn() >= last
			})
			if st.GetArchive().GetUrl() != args[1] || st.GetVisibleLsn() != last {
				t.Fatalf("primary's archive status %v at visible LSN %d; want %s archived to %d", st.GetArchive(), st.GetVisibleLsn(), args[1], last)
			}
			for i := range 3 {
				ls, err := walshipv1.NewLogStoreServiceClient(devConn(t, d.node(t, fmt.Sprintf("logstore-%d", i)))).Status(ctx, &walshipv1.LogStoreServiceStatusRequest{})
				if err != nil || ls.GetArchive().GetUrl() != args[1] {
					t.Fatalf("logstore-%d: archive %v, %v; want %s", i, ls.GetArchive(), err, args[1])
				}
			}

			verify := d.hint(t, "walship ctl verify")
			code, vout, verr := run(t, verify...)
			if code != 0 || !hasLine(vout, "problems", "none") {
				t.Fatalf("walship %s: exit %d\n%s%s", strings.Join(verify, " "), code, vout, verr)
			}
			restore := d.hint(t, "walship restore")
			code, rout, rerr := run(t, restore...)
			want := fmt.Sprintf("LSN %d, %d keys, state digest %s", last, st.GetKeys(), st.GetStateDigest())
			if code != 0 || !strings.Contains(rout, want) {
				t.Fatalf("walship %s: exit %d, want %q\n%s%s", strings.Join(restore, " "), code, want, rout, rerr)
			}
			ro := d.hint(t, "walship replica")
			if dir := flagValue(t, ro, "data-dir"); dir != flagValue(t, restore, "data-dir") {
				t.Fatalf("the read-only replica's hint serves %s, the restore wrote %s", dir, flagValue(t, restore, "data-dir"))
			}
			// As printed, it serves (it has an --id, and ports of its own).
			runHint(t, ro, "replica serving")()
		})
	}
}

// TestDevWithoutArchive: without --archive, walship dev prints no archive
// section and no log store has one; --archive-* flags without --archive
// are a usage error naming --archive.
func TestDevWithoutArchive(t *testing.T) {
	d := startDev(t, "--replicas", "1")
	if out := d.out.String(); strings.Contains(out, "archive") {
		t.Fatalf("walship dev without --archive mentions an archive:\n%s", out)
	}
	st, err := walshipv1.NewAdminServiceClient(devConn(t, d.node(t, "primary"))).Status(t.Context(), &walshipv1.StatusRequest{})
	if err != nil || st.GetArchive() != nil {
		t.Fatalf("primary's archive status without --archive: %v, %v", st.GetArchive(), err)
	}
	code, _, errOut := run(t, "dev", "--archive-endpoint", "http://127.0.0.1:1")
	if code != 2 || !strings.Contains(errOut, "--archive: required with the other --archive-* flags") {
		t.Fatalf("dev --archive-endpoint alone: exit %d, %q", code, errOut)
	}
}

// hasLine reports whether out has a line of exactly these fields.
func hasLine(out string, fields ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		if strings.Join(strings.Fields(line), " ") == strings.Join(fields, " ") {
			return true
		}
	}
	return false
}

// TestDevGetHintNamesThePutsLSN: the read-your-write hint walship dev
// prints runs as printed: its min_lsn is the LSN the printed Put returns
// (a placeholder would be refused as an invalid uint64).
func TestDevGetHintNamesThePutsLSN(t *testing.T) {
	d := startDev(t, "--replicas", "1")
	var get string
	for _, line := range strings.Split(d.out.String(), "\n") {
		if strings.Contains(line, `"min_lsn":`) {
			get = line
		}
	}
	// A primary that does not hold the election for a moment (a loaded
	// machine: the log stores' renewals time out) refuses the Put with
	// NOT_SERVING, having done nothing: try again until it takes it.
	kv := walshipv1.NewKVServiceClient(devConn(t, d.node(t, "primary")))
	var put *walshipv1.PutResponse
	testkit.UntilWithin(t, time.Minute, "the primary to take the Put", func() bool {
		var err error
		put, err = kv.Put(t.Context(), &walshipv1.PutRequest{Key: "hello", Value: []byte("world")})
		if err != nil && !client.NotApplied(err) {
			t.Fatal(err)
		}
		return err == nil
	})
	if want := fmt.Sprintf(`"min_lsn":"%d"`, put.GetLsn()); !strings.Contains(get, want) {
		t.Fatalf("the Get hint %q; want %s, the LSN the Put returned", get, want)
	}
}

// TestDevStopAndRestart follows walship dev's own hints in the README's
// order: a switchover to replica-0, kill -USR1 (which stops replica-0,
// the primary now), the promotion it prints — of a replica that still
// runs — and kill -USR2, which starts the stopped node again as a
// replica of the new primary.
func TestDevStopAndRestart(t *testing.T) {
	d := startDev(t, "--replicas", "2", "--auto-failover=false")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("walship dev's output:\n%s", d.out.String())
		}
	})
	p := d.node(t, "primary")
	code, out, errOut := run(t, "ctl", "switchover", "--primary", p, "--target", "replica-0")
	if code != 0 {
		t.Fatalf("switchover: exit %d\n%s%s", code, out, errOut)
	}
	signalDev(t, syscall.SIGUSR1)
	testkit.UntilWithin(t, time.Minute, "walship dev to stop replica-0", func() bool {
		return strings.Contains(d.out.String(), "\nreplica-0 stopped\n")
	})
	after := d.out.String()[strings.Index(d.out.String(), "stopping replica-0, the primary"):]
	promote := ""
	for _, line := range strings.Split(after, "\n") {
		if line = strings.TrimSpace(line); strings.HasPrefix(line, "walship ctl promote --node ") {
			promote = strings.TrimPrefix(line, "walship ctl promote --node ")
		}
	}
	stopped := d.node(t, "replica-0")
	if promote == "" || promote == stopped {
		t.Fatalf("the hint promotes %q; replica-0 (%s) is the stopped node:\n%s", promote, stopped, after)
	}
	// The node the hint names may be the old primary, which restarts its
	// server as a replica after the switchover: promote once it answers,
	// as someone reading the hint would.
	testkit.UntilWithin(t, 30*time.Second, "the node the hint names to answer", func() bool {
		code, _, _ := run(t, "ctl", "status", "--nodes", promote)
		return code == 0
	})
	if code, out, errOut := run(t, "ctl", "promote", "--node", promote); code != 0 {
		t.Fatalf("the printed promotion: exit %d\n%s%s", code, out, errOut)
	}
	signalDev(t, syscall.SIGUSR2)
	testkit.UntilWithin(t, time.Minute, "walship dev to start replica-0 again", func() bool {
		return strings.Contains(d.out.String(), "started replica-0 again at "+stopped+": the replica")
	})
	nodes := strings.Join([]string{p, stopped, d.node(t, "replica-1")}, ",")
	testkit.UntilWithin(t, 30*time.Second, "every node to answer ctl status", func() bool {
		code, _, _ := run(t, "ctl", "status", "--nodes", nodes)
		return code == 0
	})
}

// TestDevFailsOverByItself: by default kill -USR1 heals with no command —
// a replica promotes itself on the log stores' election — and kill -USR2
// brings the stopped primary back as a replica of the new one.
func TestDevFailsOverByItself(t *testing.T) {
	d := startDev(t, "--replicas", "2", "--logstores", "3")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("walship dev's output:\n%s", d.out.String())
		}
	})
	if !strings.Contains(d.out.String(), "a replica promotes itself") {
		t.Fatalf("walship dev does not say failover is automatic:\n%s", d.out.String())
	}
	p, r0, r1 := d.node(t, "primary"), d.node(t, "replica-0"), d.node(t, "replica-1")
	signalDev(t, syscall.SIGUSR1)
	testkit.UntilWithin(t, time.Minute, "walship dev to stop the primary", func() bool {
		return strings.Contains(d.out.String(), "\nprimary stopped\n")
	})
	if !strings.Contains(d.out.String(), "failover is automatic") {
		t.Fatalf("kill -USR1's text does not say failover is automatic:\n%s", d.out.String())
	}
	newPrimary := ""
	testkit.UntilWithin(t, time.Minute, "a replica to promote itself and take writes", func() bool {
		for _, a := range []string{r0, r1} {
			st, err := walshipv1.NewAdminServiceClient(devConn(t, a)).Status(t.Context(), &walshipv1.StatusRequest{})
			if err == nil && st.GetRole() == walshipv1.Role_ROLE_PRIMARY && st.GetTakingWrites() {
				newPrimary = a
				return true
			}
		}
		return false
	})
	if _, err := walshipv1.NewKVServiceClient(devConn(t, newPrimary)).Put(t.Context(), &walshipv1.PutRequest{Key: "after", Value: []byte("failover")}); err != nil {
		t.Fatal(err)
	}
	signalDev(t, syscall.SIGUSR2)
	testkit.UntilWithin(t, time.Minute, "the old primary to rejoin as a replica", func() bool {
		st, err := walshipv1.NewAdminServiceClient(devConn(t, p)).Status(t.Context(), &walshipv1.StatusRequest{})
		return err == nil && st.GetRole() == walshipv1.Role_ROLE_REPLICA && st.GetPrimaryId() != "primary"
	})
	code, out, _ := run(t, "ctl", "status", "--nodes", strings.Join([]string{p, r0, r1}, ","))
	if code != 0 || !strings.Contains(out, "ELECTION") {
		t.Fatalf("ctl status: exit %d, no election view:\n%s", code, out)
	}
}

// signalDev sends sig to this process, where walship dev runs and
// catches it.
func signalDev(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(os.Getpid(), sig); err != nil {
		t.Fatal(err)
	}
}
