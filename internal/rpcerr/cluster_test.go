package rpcerr

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestCheckPeer: a node's own finding names both ids, wraps
// ErrOtherCluster, and follows CheckCluster's and RequireCluster's rules.
func TestCheckPeer(t *testing.T) {
	const a, b = "0f1e2d3c-4b5a-4968-8776-655443322110", "1f1e2d3c-4b5a-4968-8776-655443322110"
	for _, tc := range []struct {
		name               string
		check              func(role, ours, peer, theirs string) error
		ours, theirs, want string
	}{
		{"check: differ", CheckPeer, a, b, "cluster id mismatch: log store x belongs to cluster " + b + ", this primary to cluster " + a},
		{"check: same", CheckPeer, a, a, ""},
		{"check: peer states none", CheckPeer, a, "", ""},
		{"check: this one has none", CheckPeer, "", b, ""},
		{"require: differ", RequirePeer, a, b, "cluster id mismatch: log store x belongs to cluster " + b + ", this primary to cluster " + a},
		{"require: peer states none", RequirePeer, a, "", "cluster id mismatch: log store x states no cluster id, this primary belongs to cluster " + a},
		{"require: this one has none", RequirePeer, "", b, ""},
	} {
		err := tc.check("primary", tc.ours, "log store x", tc.theirs)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v; want nil", tc.name, err)
		case tc.want != "" && (err == nil || err.Error() != tc.want || !errors.Is(err, ErrOtherCluster) || !IsOtherCluster(err)):
			t.Errorf("%s: %v; want %q wrapping ErrOtherCluster", tc.name, err, tc.want)
		}
	}
}

// TestOtherCluster: the refusal is FAILED_PRECONDITION naming both ids in
// the agreed words, and is recognised after a trip over the wire and
// through wrapping; CheckCluster refuses only two known, different ids,
// RequireCluster also a peer that states none to a node that has one.
func TestOtherCluster(t *testing.T) {
	const a, b = "0f1e2d3c-4b5a-4968-8776-655443322110", "1f1e2d3c-4b5a-4968-8776-655443322110"
	err := OtherCluster("log store", a, "the primary", b)
	want := "cluster id mismatch: this log store belongs to cluster " + a + ", the primary is of cluster " + b
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition || st.Message() != want {
		t.Fatalf("OtherCluster = %v %q; want FAILED_PRECONDITION %q", st.Code(), st.Message(), want)
	}
	wire := status.FromProto(status.Convert(err).Proto()).Err() // as a peer receives it
	for _, e := range []error{err, wire, fmt.Errorf("shipping: %w", wire)} {
		if !IsOtherCluster(e) {
			t.Errorf("IsOtherCluster(%v) = false", e)
		}
		if ours, theirs, ok := ClusterIDs(e); !ok || ours != a || theirs != b {
			t.Errorf("ClusterIDs(%v) = %q, %q, %v", e, ours, theirs, ok)
		}
	}
	for _, e := range []error{nil, errors.New("x"), status.Error(codes.FailedPrecondition, "stale epoch 3")} {
		if IsOtherCluster(e) {
			t.Errorf("IsOtherCluster(%v) = true", e)
		}
	}
	m := Mismatch("log store %s belongs to cluster %s", "ls:1", b)
	if !IsOtherCluster(m) || Code(m) != codes.FailedPrecondition || status.Code(Status(m)) != codes.FailedPrecondition {
		t.Errorf("Mismatch: IsOtherCluster %v, code %v", IsOtherCluster(m), Code(m))
	}
	for _, tc := range []struct {
		ours, theirs      string
		refused, required bool
	}{{a, b, true, true}, {a, a, false, false}, {"", b, false, false}, {a, "", false, true}, {"", "", false, false}} {
		if got := CheckCluster("replica", tc.ours, "the primary", tc.theirs) != nil; got != tc.refused {
			t.Errorf("CheckCluster(%q, %q) refused = %v", tc.ours, tc.theirs, got)
		}
		if got := RequireCluster("replica", tc.ours, "the primary", tc.theirs) != nil; got != tc.required {
			t.Errorf("RequireCluster(%q, %q) refused = %v", tc.ours, tc.theirs, got)
		}
	}
	none := RequireCluster("log store", a, "the candidate c9", "")
	if st := status.Convert(none); st.Code() != codes.FailedPrecondition || st.Message() != "cluster id mismatch: this log store belongs to cluster "+a+", the candidate c9 states no cluster id" || !IsOtherCluster(none) {
		t.Errorf("RequireCluster with no id stated = %v %q", st.Code(), st.Message())
	}
}
