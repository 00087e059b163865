package rpcerr

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestClusterGuard(t *testing.T) {
	const a, b = "0a0a0a0a-0a0a-4a0a-8a0a-0a0a0a0a0a0a", "0b0b0b0b-0b0b-4b0b-8b0b-0b0b0b0b0b0b"
	ours := ""
	refused := 0
	var log bytes.Buffer
	g := ClusterGuard{Role: "log store", ID: func() string { return ours }, Refused: func() { refused++ },
		Logger: slog.New(slog.NewTextHandler(&log, nil))}
	// No id yet: anything passes, Require too (the node adopts it).
	if g.Check(b, "the primary") != nil || g.Require("", "the primary") != nil || refused != 0 {
		t.Fatalf("a node without an id refused a peer (%d)", refused)
	}
	ours = a
	for _, tc := range []struct {
		name    string
		err     error
		refused bool
	}{
		{"check, same", g.Check(a, "the replica r1"), false},
		{"check, none", g.Check("", "the replica r1"), false},
		{"check, other", g.Check(b, "the replica r1"), true},
		{"require, same", g.Require(a, "the candidate c1"), false},
		{"require, none", g.Require("", "the candidate c1"), true},
		{"require, other", g.Require(b, "the candidate c1"), true},
	} {
		if (tc.err != nil) != tc.refused {
			t.Errorf("%s: %v", tc.name, tc.err)
			continue
		}
		if tc.refused && (!IsOtherCluster(tc.err) || status.Code(tc.err) != codes.FailedPrecondition || !strings.Contains(tc.err.Error(), "this log store belongs to cluster "+a)) {
			t.Errorf("%s: refusal %v", tc.name, tc.err)
		}
	}
	if refused != 3 || strings.Count(log.String(), "refused a peer of another cluster") != 3 {
		t.Fatalf("%d refusals counted, log:\n%s", refused, log.String())
	}
}

func TestCheckClusterID(t *testing.T) {
	if err := CheckClusterID("hello.cluster_id", ""); err != nil {
		t.Fatalf("no id: %v", err)
	}
	if err := CheckClusterID("hello.cluster_id", "0a0a0a0a-0a0a-4a0a-8a0a-0a0a0a0a0a0a"); err != nil {
		t.Fatalf("a valid id: %v", err)
	}
	err := CheckClusterID("hello.cluster_id", "not-a-uuid")
	if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), "hello.cluster_id: ") {
		t.Fatalf("malformed id: %v", err)
	}
}
