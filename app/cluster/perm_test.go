package cluster

import (
	"io/fs"
	"path/filepath"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/vfs"
)

// TestDataIsPrivate: every directory and file a cluster's nodes write —
// WALs, snapshots (taken at the clean stop), votes, histories, cluster ids,
// a log store's base snapshots, the TLS keys of `walship dev --tls` — is
// readable by the process's user alone (0700 directories, 0600 files;
// the umask can only take bits away).
func TestDataIsPrivate(t *testing.T) {
	dir := t.TempDir()
	c := startCluster(t, Config{Dir: dir, LogStores: 1, Replicas: 1})
	for i := range 50 {
		if _, err := walshipv1.NewKVServiceClient(c.Conn(c.Primary)).Put(t.Context(), &walshipv1.PutRequest{Key: "k", Value: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	waitConverged(t, c)
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := DevTLS(filepath.Join(dir, "tls"), "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		var public fs.FileMode
		if d.IsDir() {
			public = info.Mode().Perm() &^ vfs.DirPerm
			seen["dirs"]++
		} else {
			public = info.Mode().Perm() &^ vfs.FilePerm
			seen[filepath.Ext(path)]++
		}
		// Certificates and the CA bundle are public by nature; keys are not.
		if ext := filepath.Ext(path); ext == ".crt" {
			return nil
		}
		if public != 0 {
			t.Errorf("%s: mode %v grants %v beyond the owner", path, info.Mode(), public)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen["dirs"] == 0 || seen[".wal"] == 0 || seen[".key"] == 0 {
		t.Fatalf("walked %v: the test saw no WAL segment, key or directory", seen)
	}
	t.Logf("checked %v", seen)
}
