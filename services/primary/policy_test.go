package primary

import (
	"strings"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestValidatePolicyEnums(t *testing.T) {
	if err := validatePolicyEnums(&walshipv1.CommitPolicy{Durability: 2, Replication: 3, SyncLevel: 1, Logstore: 2}); err != nil {
		t.Fatal(err)
	}
	err := validatePolicyEnums(&walshipv1.CommitPolicy{SyncLevel: 42})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "policy.sync_level") {
		t.Fatalf("unknown sync_level: %v", err)
	}
}
