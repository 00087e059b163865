package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	grpcurlOnce sync.Once
	grpcurlPath string
	grpcurlErr  error
)

// grpcurl returns the grpcurl binary: $WALSHIP_GRPCURL, one on PATH, or one
// built from the version pinned in tools/go.mod.
func grpcurl(t *testing.T) string {
	t.Helper()
	grpcurlOnce.Do(func() {
		if p := os.Getenv("WALSHIP_GRPCURL"); p != "" {
			if _, err := os.Stat(p); err == nil {
				grpcurlPath = p
				return
			}
		}
		if p, err := exec.LookPath("grpcurl"); err == nil {
			grpcurlPath = p
			return
		}
		dir, err := os.MkdirTemp("", "walship-e2e-grpcurl")
		if err != nil {
			grpcurlErr = err
			return
		}
		grpcurlPath = filepath.Join(dir, "grpcurl")
		cmd := exec.Command("go", "build", "-modfile", "../../tools/go.mod", "-o", grpcurlPath, "github.com/fullstorydev/grpcurl/cmd/grpcurl")
		if out, err := cmd.CombinedOutput(); err != nil {
			grpcurlErr = err
			grpcurlPath = string(out)
		}
	})
	if grpcurlErr != nil {
		t.Skipf("grpcurl not available (make test builds it into bin/): %v: %s", grpcurlErr, grpcurlPath)
	}
	return grpcurlPath
}

// run runs grpcurl with args and returns its stdout, failing on error.
func runGrpcurl(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, grpcurl(t), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("grpcurl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestGrpcurlAgainstPrimary(t *testing.T) {
	gc := grpcurl(t)
	_ = gc
	p := startProc(t, "primary serving", "primary", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", t.TempDir())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	p.dial(ctx)

	list := runGrpcurl(t, "-plaintext", p.addr, "list")
	for _, svc := range []string{"walship.v1.KVService", "walship.v1.AdminService", "walship.v1.ReplicationService", "grpc.health.v1.Health"} {
		if !strings.Contains(list, svc) {
			t.Errorf("grpcurl list does not show %s:\n%s", svc, list)
		}
	}
	desc := runGrpcurl(t, "-plaintext", p.addr, "describe", "walship.v1.PutRequest")
	if !strings.Contains(desc, "1..4096 bytes of valid UTF-8") {
		t.Errorf("describe walship.v1.PutRequest lacks the field docs:\n%s", desc)
	}
	health := runGrpcurl(t, "-plaintext", p.addr, "grpc.health.v1.Health/Check")
	if !strings.Contains(health, `"SERVING"`) {
		t.Errorf("health check: %s", health)
	}

	var put struct{ Lsn string }
	out := runGrpcurl(t, "-plaintext", "-d", `{"key":"greeting","value":"aGVsbG8="}`, p.addr, "walship.v1.KVService/Put")
	if err := json.Unmarshal([]byte(out), &put); err != nil || put.Lsn == "" {
		t.Fatalf("Put output %q: %v", out, err)
	}
	out = runGrpcurl(t, "-plaintext", "-d", `{"key":"greeting","min_lsn":"`+put.Lsn+`"}`, p.addr, "walship.v1.KVService/Get")
	var get struct {
		Found      bool
		Value      string
		VersionLsn string
	}
	if err := json.Unmarshal([]byte(out), &get); err != nil || !get.Found || get.Value != "aGVsbG8=" || get.VersionLsn != put.Lsn {
		t.Fatalf("Get output %q: %v", out, err)
	}
	txn := `{"compares":[{"key":"greeting","target":"COMPARE_TARGET_VERSION","result":"COMPARE_RESULT_EQUAL","version_lsn":"` + put.Lsn + `"}],
		"success":[{"put":{"key":"greeting","value":"d29ybGQ="}},{"get":{"key":"greeting"}}]}`
	out = runGrpcurl(t, "-plaintext", "-d", txn, p.addr, "walship.v1.KVService/Txn")
	var tr struct {
		Succeeded bool
		Results   []struct {
			Get *struct{ Value string }
		}
	}
	if err := json.Unmarshal([]byte(out), &tr); err != nil || !tr.Succeeded || len(tr.Results) != 2 || tr.Results[1].Get == nil || tr.Results[1].Get.Value != "d29ybGQ=" {
		t.Fatalf("Txn output %q: %v", out, err)
	}
	// Pipeline: several operations on one stream (grpcurl sends each JSON
	// message of -d), each answered with its id, a bad one as the unary
	// call would fail.
	out = runGrpcurl(t, "-plaintext", "-d", `{"id":"1","put":{"key":"p1","value":"dg=="}} {"id":"2","delete":{"key":"p0"}} {"id":"3","put":{"key":""}}`,
		p.addr, "walship.v1.KVService/Pipeline")
	type answer struct {
		ID     string `json:"id"`
		Put    *struct{ Lsn string }
		Delete *struct{ Lsn string }
		Error  *struct {
			Code    int
			Message string
		}
	}
	answers := map[string]answer{}
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var a answer
		if err := dec.Decode(&a); err != nil {
			t.Fatalf("Pipeline output %q: %v", out, err)
		}
		answers[a.ID] = a
	}
	if a := answers["1"]; a.Put == nil || a.Put.Lsn == "" {
		t.Errorf("Pipeline put: %q", out)
	}
	if a := answers["2"]; a.Delete == nil || a.Delete.Lsn == "" {
		t.Errorf("Pipeline delete: %q", out)
	}
	if a := answers["3"]; a.Error == nil || a.Error.Code != 3 || !strings.HasPrefix(a.Error.Message, "key:") {
		t.Errorf("Pipeline put with an empty key: want INVALID_ARGUMENT (3) naming key: %q", out)
	}
	status := runGrpcurl(t, "-plaintext", p.addr, "walship.v1.AdminService/Status")
	if !strings.Contains(status, `"ROLE_PRIMARY"`) || !strings.Contains(status, `"stateDigest"`) {
		t.Errorf("Status output: %s", status)
	}
	// Bad input comes back as InvalidArgument naming the field.
	cmd := exec.Command(gc, "-plaintext", "-d", `{"key":""}`, p.addr, "walship.v1.KVService/Put")
	bad, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(bad), "InvalidArgument") || !strings.Contains(string(bad), "key") {
		t.Errorf("Put with an empty key: %v\n%s", err, bad)
	}
	p.stop()
}
