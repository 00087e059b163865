// Package s3test runs a real S3-compatible server for tests: SeaweedFS's
// `weed mini` (Apache-2.0), built from its module by `make seaweedfs`
// (tools/seaweedfs) into bin/weed. Each server gets a directory, ports of
// its own on loopback and an access key, so anonymous requests are
// refused as on a real store; it stops when the test ends.
package s3test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/walship/walship/internal/testkit"
)

// EnvWeed names the weed binary; make test sets it to bin/weed.
const EnvWeed = "WALSHIP_WEED"

// Credentials of every test server.
const (
	AccessKey = "walshiptest"
	SecretKey = "walship-test-secret-key"
)

// Server is a running S3 server.
type Server struct {
	// Endpoint is the S3 endpoint (http://IP:PORT, IP 127.0.0.1 unless
	// started by StartOn).
	Endpoint string
	// Bucket exists from the start.
	Bucket string

	tb   testing.TB
	dir  string
	args []string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	logs *testkit.Output
}

// Binary returns the weed binary, or skips tb saying how to build it.
func Binary(tb testing.TB) string {
	tb.Helper()
	p := os.Getenv(EnvWeed)
	if p == "" {
		tb.Skipf("%s is not set: build SeaweedFS's weed with `make seaweedfs` (make test does)", EnvWeed)
	}
	if _, err := os.Stat(p); err != nil {
		tb.Skipf("%s: %v: build it with `make seaweedfs`", EnvWeed, err)
	}
	return p
}

// Start runs a server with bucket made, on loopback, and stops it when tb
// ends.
func Start(tb testing.TB, bucket string) *Server {
	tb.Helper()
	return StartOn(tb, bucket, "127.0.0.1")
}

// StartOn is Start on the address ip, for clients that are not on this
// host's loopback: the pods of a cluster on this host reach it at the
// host's address.
func StartOn(tb testing.TB, bucket, ip string) *Server {
	tb.Helper()
	bin := Binary(tb)
	// weed's gRPC ports are its HTTP ports + 10000: both must be free,
	// and below the ephemeral range, where no outgoing connection takes
	// them meanwhile (newServer). A port picked free can still be taken
	// by another test process before weed binds it; weed then exits
	// ("address already in use") and is started again on other ports.
	for attempt := 1; ; attempt++ {
		dir := tb.TempDir() // a new one each time: nothing of a failed start stays
		if err := os.MkdirAll(filepath.Join(dir, "data"), 0o700); err != nil {
			tb.Fatal(err)
		}
		s := newServer(tb, bucket, dir, ip)
		s.start(bin)
		err := s.waitReady(90 * time.Second)
		if err == nil {
			tb.Cleanup(s.Stop)
			return s
		}
		s.Stop()
		if !errors.Is(err, errExited) || !strings.Contains(s.logs.String(), "address already in use") || attempt == 3 {
			tb.Fatalf("%v: %s", err, s.logs.Tail(4000))
		}
	}
}

// newServer is a server on ip, on ports picked now, not started.
func newServer(tb testing.TB, bucket, dir, ip string) *Server {
	ports := pickPorts(tb, ip, 5)
	s3Port, master, volume, filer, admin := ports[0], ports[1], ports[2], ports[3], ports[4]
	return &Server{
		Endpoint: "http://" + net.JoinHostPort(ip, strconv.Itoa(s3Port)),
		Bucket:   bucket,
		tb:       tb,
		dir:      dir,
		logs:     &testkit.Output{},
		args: []string{"mini", "-dir=" + filepath.Join(dir, "data"), "-ip=" + ip, "-ip.bind=" + ip,
			"-s3.port=" + strconv.Itoa(s3Port), "-master.port=" + strconv.Itoa(master), "-volume.port=" + strconv.Itoa(volume),
			"-filer.port=" + strconv.Itoa(filer), "-admin.port=" + strconv.Itoa(admin), "-admin.port.legacy=0",
			"-admin.ui=false", "-webdav=false", "-s3.autoCreateBucket=false", "-master.telemetry=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
			"-filer.localSocket=" + filepath.Join(dir, "filer.sock"), "-s3.localSocket=" + filepath.Join(dir, "s3.sock"),
			"-bucket=" + bucket},
	}
}

func (s *Server) start(bin string) {
	cmd := exec.Command(bin, s.args...)
	cmd.Dir = s.dir
	// The access key made at the first start; anonymous requests are
	// refused from then on.
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID="+AccessKey, "AWS_SECRET_ACCESS_KEY="+SecretKey)
	cmd.Stdout, cmd.Stderr = s.logs, s.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		s.tb.Fatalf("start weed: %v", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
}

// WaitReady waits until the bucket answers, or fails the test with the
// server's log.
func (s *Server) WaitReady(within time.Duration) {
	s.tb.Helper()
	if err := s.waitReady(within); err != nil {
		s.tb.Fatalf("%v: %s", err, s.logs.Tail(4000))
	}
}

// errExited is waitReady's error when weed exits before it is ready.
var errExited = errors.New("weed exited before it was ready")

// waitReady waits until the bucket answers, weed exits (errExited) or
// within passes.
func (s *Server) waitReady(within time.Duration) error {
	client := s.Client()
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		s.mu.Lock()
		done := s.done
		s.mu.Unlock()
		select {
		case <-done:
			return errExited
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, last = client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(s.Bucket)})
		cancel()
		if last == nil {
			return nil
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-t.C:
		case <-done:
			t.Stop()
		}
	}
	return fmt.Errorf("weed not ready within %v (%v)", within, last)
}

// Client is an S3 client of the server with its access key.
func (s *Server) Client() *s3.Client {
	return s3.New(s3.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(s.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
		// Checksums as walship's own client asks for them.
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
	})
}

// Env is the environment a walship process needs to reach the server
// (the AWS SDK's default credential chain reads it).
func (s *Server) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + AccessKey, "AWS_SECRET_ACCESS_KEY=" + SecretKey, "AWS_REGION=us-east-1",
		"AWS_EC2_METADATA_DISABLED=true"}
}

// Pause stops the server's processes (SIGSTOP): requests hang, as with a
// store that cannot be reached. It returns once every thread of the
// server is stopped, so that no request sent after it is answered.
// Resume undoes it.
func (s *Server) Pause() {
	s.tb.Helper()
	s.signal(syscall.SIGSTOP)
	s.mu.Lock()
	pid := s.cmd.Process.Pid
	s.mu.Unlock()
	testkit.Until(s.tb, fmt.Sprintf("every thread of weed (pid %d) to stop", pid), func() bool {
		stopped, err := testkit.ThreadsStopped(pid)
		if err != nil {
			s.tb.Fatalf("pause weed (pid %d): %v\n%s", pid, err, s.logs.Tail(4000))
		}
		return stopped
	})
}

// Resume continues a paused server.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil && s.cmd.Process != nil {
		_ = syscall.Kill(-s.cmd.Process.Pid, sig)
	}
}

// Stop kills the server and waits for it.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT)
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// Logs is the end of the server's output.
func (s *Server) Logs() string { return s.logs.Tail(8000) }

// pickPorts returns n ports p, each with p and p+10000 free on ip and
// below the ephemeral range.
func pickPorts(tb testing.TB, ip string, n int) []int {
	tb.Helper()
	var out []int
	seen := map[int]bool{}
	for tries := 0; len(out) < n && tries < 1000; tries++ {
		p := 10000 + rand.IntN(12000)
		if seen[p] {
			continue
		}
		seen[p] = true
		if free(ip, p) && free(ip, p+10000) {
			out = append(out, p)
		}
	}
	if len(out) < n {
		tb.Fatal("no free ports for weed")
	}
	return out
}

func free(ip string, port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}
