package check

import walshipv1 "github.com/walship/walship/gen/walship/v1"

// NewStaleServer is the stale server of TestCheckerRejectsAStaleServer,
// for the tests of package check_test.
func NewStaleServer(next walshipv1.KVServiceClient) walshipv1.KVServiceServer {
	return &staleServer{next: next, prev: map[string]register{}, cur: map[string]register{}}
}
