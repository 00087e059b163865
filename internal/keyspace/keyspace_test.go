package keyspace

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestValidateKey(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want string
	}{
		{"", "must not be empty"},
		{strings.Repeat("x", MaxKeyBytes+1), "4097 bytes"},
		{string([]byte{0xc3, 0x28}), "not valid UTF-8"},
	} {
		err := ValidateKey("key", tc.key)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "key:") {
			t.Errorf("ValidateKey(%q...) = %v; want InvalidArgument %q naming the field", tc.key[:min(len(tc.key), 8)], err, tc.want)
		}
	}
	if err := ValidateKey("key", strings.Repeat("é", MaxKeyBytes/2)); err != nil {
		t.Errorf("a 4096-byte UTF-8 key: %v", err)
	}
}
