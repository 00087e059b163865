package apidesc

import (
	"strings"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// TestDescriptorsMatchGeneratedCode guards against a stale walship.binpb:
// apart from comments, the embedded descriptors must equal the generated
// ones, and they must carry the comments.
func TestDescriptorsMatchGeneratedCode(t *testing.T) {
	r, err := NewResolver()
	if err != nil {
		t.Fatal(err)
	}
	for _, gen := range []protoreflect.FileDescriptor{
		walshipv1.File_walship_v1_kv_proto, walshipv1.File_walship_v1_wal_proto, walshipv1.File_walship_v1_policy_proto,
		walshipv1.File_walship_v1_replication_proto, walshipv1.File_walship_v1_logstore_proto, walshipv1.File_walship_v1_admin_proto,
	} {
		own, err := r.FindFileByPath(gen.Path())
		if err != nil {
			t.Fatalf("%s: %v", gen.Path(), err)
		}
		a, b := protodesc.ToFileDescriptorProto(own), protodesc.ToFileDescriptorProto(gen)
		a.SourceCodeInfo, b.SourceCodeInfo = nil, nil
		if !proto.Equal(a, b) {
			t.Errorf("%s: the embedded descriptor differs from the generated code: run make generate", gen.Path())
		}
	}
	d, err := r.FindDescriptorByName("walship.v1.PutRequest")
	if err != nil {
		t.Fatal(err)
	}
	md := d.(protoreflect.MessageDescriptor)
	loc := md.ParentFile().SourceLocations().ByDescriptor(md.Fields().ByName("key"))
	if !strings.Contains(loc.LeadingComments, "UTF-8") {
		t.Errorf("PutRequest.key comment = %q; want the field's documentation", loc.LeadingComments)
	}
	if _, err := r.FindFileByPath("google/protobuf/duration.proto"); err != nil {
		t.Errorf("imports must resolve too: %v", err)
	}
}
