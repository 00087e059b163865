package cluster

import (
	"strings"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestSyncReplicasBeyondMembers: a sync commit that waits for more
// replicas than the cluster has other members is refused before it is
// written (INVALID_ARGUMENT naming the field), not written and then timed
// out; SetPolicy refuses such a default too.
func TestSyncReplicasBeyondMembers(t *testing.T) {
	c := startCluster(t, Config{LogStores: 1, Replicas: 1, Failover: true})
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	pol := &walshipv1.CommitPolicy{Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncReplicas: 2}
	_, err := kv.Put(t.Context(), &walshipv1.PutRequest{Key: "k", Value: []byte("v"), Policy: pol})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "sync_replicas: 2 is more than the 1 other members") ||
		!strings.Contains(st.Message(), "replica-0") {
		t.Fatalf("Put with sync_replicas 2 of 1: %v", err)
	}
	got, err := kv.Get(t.Context(), &walshipv1.GetRequest{Key: "k"})
	if err != nil || got.GetFound() {
		t.Fatalf("the refused write landed: %v, %v", got, err)
	}
	_, err = walshipv1.NewAdminServiceClient(c.Conn(c.Primary)).SetPolicy(t.Context(), &walshipv1.SetPolicyRequest{Policy: pol})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "sync_replicas") {
		t.Fatalf("SetPolicy with sync_replicas 2 of 1: %v", err)
	}
	pol.SyncReplicas = 1
	if _, err := kv.Put(t.Context(), &walshipv1.PutRequest{Key: "k", Value: []byte("v"), Policy: pol}); err != nil {
		t.Fatalf("Put with sync_replicas 1 of 1: %v", err)
	}
}
