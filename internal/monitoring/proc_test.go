package monitoring

// Helpers for the end-to-end test (cluster_test.go): real walship and
// prometheus processes, and a small Prometheus HTTP API client. The process
// helpers are a trimmed copy of internal/e2e/proc_test.go (test files of
// another package cannot be imported); the binary comes from internal/testkit.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/walship/walship/internal/testkit"
)

// walshipBin returns the walship binary ($WALSHIP_BIN, or built once).
func walshipBin(t *testing.T) string { return testkit.Walship(t) }

// cleanEnv drops WALSHIP_* variables so the test's flags are the only config.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WALSHIP_") {
			env = append(env, kv)
		}
	}
	return env
}

// proc is a child process whose output is kept for error messages.
type proc struct {
	name    string
	cmd     *exec.Cmd
	out     testkit.Output
	done    chan struct{}
	addr    string // walship: gRPC address from the serving line
	metrics string // walship: metrics address from the serving line
}

// startProc starts path with args; Cleanup kills it (SIGKILL, which also
// ends a SIGSTOPped process) and waits for it to be gone.
func startProc(t *testing.T, name, path string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(path, args...), done: make(chan struct{})}
	p.cmd.Env = cleanEnv()
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(p.kill)
	return p
}

func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) logs() string { return p.out.String() }

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%s: signal %v: %v", p.name, sig, err)
	}
}

// startWalship runs `walship <args...> --log-format json` and waits for the
// JSON log line whose msg is servingMsg, taking its addr and metrics
// attributes.
func startWalship(t *testing.T, bin, name, servingMsg string, args ...string) *proc {
	t.Helper()
	p := startProc(t, name, bin, append(args, "--log-format", "json")...)
	deadline := time.Now().Add(60 * time.Second)
	// The log is another process's output: it is re-read on a ticker until
	// the line appears or the deadline passes.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		sc := bufio.NewScanner(strings.NewReader(p.logs()))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var rec struct{ Msg, Addr, Metrics string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == servingMsg {
				if rec.Addr == "" || rec.Metrics == "" {
					t.Fatalf("%s: serving line without addr or metrics: %s", name, sc.Text())
				}
				p.addr, p.metrics = rec.Addr, rec.Metrics
				return p
			}
		}
		switch {
		case p.exited():
			t.Fatalf("%s exited before serving:\n%s", name, p.logs())
		case time.Now().After(deadline):
			t.Fatalf("%s did not log %q within 60s:\n%s", name, servingMsg, p.logs())
		}
		<-tick.C
	}
}

// freePort returns a loopback port that was free a moment ago
// (testkit.FreeAddr's).
func freePort(t *testing.T) int {
	t.Helper()
	_, port, err := net.SplitHostPort(testkit.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// startPrometheus runs prometheus with config on a free loopback port and
// waits until /-/ready answers 200. It retries with another port if the
// chosen one was taken in the meantime.
func startPrometheus(t *testing.T, promBin, config, dataDir string) (*proc, *promClient) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
		p := startProc(t, "prometheus", promBin,
			"--config.file="+config,
			"--storage.tsdb.path="+dataDir,
			"--web.listen-address="+addr,
			"--log.level=warn",
		)
		c := &promClient{base: "http://" + addr, hc: &http.Client{Timeout: 10 * time.Second}}
		deadline := time.Now().Add(60 * time.Second)
		tick := time.NewTicker(100 * time.Millisecond) // Prometheus is another process: sample /-/ready
		for !p.exited() && time.Now().Before(deadline) {
			if resp, err := c.hc.Get(c.base + "/-/ready"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					tick.Stop()
					return p, c
				}
			}
			<-tick.C
		}
		tick.Stop()
		p.kill()
		if attempt < 3 && strings.Contains(p.logs(), "address already in use") {
			continue
		}
		t.Fatalf("prometheus not ready within 60s (exited: %v):\n%s", p.exited(), p.logs())
	}
}

// promClient queries Prometheus's HTTP API.
type promClient struct {
	base string
	hc   *http.Client
}

// sample is one element of an instant query's result.
type sample struct {
	Metric map[string]string
	Value  float64
}

func (s sample) String() string {
	return fmt.Sprintf("%v = %g", s.Metric, s.Value)
}

func promTime(at time.Time) string {
	return strconv.FormatFloat(float64(at.UnixMilli())/1000, 'f', 3, 64)
}

// get calls an API endpoint and returns its data field.
func (c *promClient) get(ctx context.Context, path string, params url.Values) (json.RawMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path+"?"+params.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var r struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("%s: HTTP %d: %v: %s", path, resp.StatusCode, err, body)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s %v: %s", path, params, r.Error)
	}
	return r.Data, nil
}

// query evaluates expr at time at (now if zero): a vector or a scalar (as
// one sample without labels).
func (c *promClient) query(ctx context.Context, expr string, at time.Time) ([]sample, error) {
	params := url.Values{"query": {expr}}
	if !at.IsZero() {
		params.Set("time", promTime(at))
	}
	data, err := c.get(ctx, "/api/v1/query", params)
	if err != nil {
		return nil, err
	}
	var d struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, err
	}
	switch d.ResultType {
	case "scalar":
		var v [2]any
		if err := json.Unmarshal(d.Result, &v); err != nil {
			return nil, err
		}
		f, err := parseValue(v[1])
		return []sample{{Metric: map[string]string{}, Value: f}}, err
	case "vector":
		var vs []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		}
		if err := json.Unmarshal(d.Result, &vs); err != nil {
			return nil, err
		}
		out := make([]sample, 0, len(vs))
		for _, v := range vs {
			f, err := parseValue(v.Value[1])
			if err != nil {
				return nil, err
			}
			out = append(out, sample{Metric: v.Metric, Value: f})
		}
		return out, nil
	default:
		return nil, fmt.Errorf("query %q: result type %q, want vector or scalar", expr, d.ResultType)
	}
}

func parseValue(v any) (float64, error) {
	s, ok := v.(string)
	if !ok {
		return 0, fmt.Errorf("sample value %v is not a string", v)
	}
	return strconv.ParseFloat(s, 64)
}

// poll calls cond every 250ms until it reports done, failing the test with
// cond's last note when d has passed. Prometheus and the services are other
// processes: their state is sampled, there is nothing to be notified by.
func poll(t *testing.T, d time.Duration, what string, cond func() (done bool, note string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		done, note := cond()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v; last: %s", what, d, note)
		}
		<-tick.C
	}
}
