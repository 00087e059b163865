package realkube

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"testing"
)

// TestWriteImageLayout checks the archive against the OCI image layout: the
// index names the image, and every descriptor's digest and size match its blob.
func TestWriteImageLayout(t *testing.T) {
	img := Image{
		Name:       "docker.io/library/walship:test",
		Entrypoint: []string{"/walship"},
		User:       "65532:65532",
		Files: []ImageFile{
			{Path: "walship", Mode: 0o755, Data: []byte("binary")},
			{Path: "data", Mode: 0o755, Dir: true, UID: 65532, GID: 65532},
		},
	}
	var buf bytes.Buffer
	if err := WriteImage(&buf, img); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = data
	}
	var index struct {
		Manifests []ociDescriptor
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	if len(index.Manifests) != 1 || index.Manifests[0].Annotations["io.containerd.image.name"] != img.Name {
		t.Fatalf("index manifests = %+v, want one named %s", index.Manifests, img.Name)
	}
	blob := func(d ociDescriptor) []byte {
		t.Helper()
		b, ok := files["blobs/sha256/"+d.Digest[len("sha256:"):]]
		if !ok || len(b) != d.Size || "sha256:"+hexOf(b) != d.Digest {
			t.Fatalf("blob %s (size %d) missing or mismatched", d.Digest, d.Size)
		}
		return b
	}
	var manifest struct {
		Config ociDescriptor
		Layers []ociDescriptor
	}
	if err := json.Unmarshal(blob(index.Manifests[0]), &manifest); err != nil {
		t.Fatal(err)
	}
	blob(manifest.Config)
	if len(manifest.Layers) != 1 {
		t.Fatalf("layers = %d, want 1", len(manifest.Layers))
	}
	layer := tar.NewReader(bytes.NewReader(blob(manifest.Layers[0])))
	var names []string
	for {
		h, err := layer.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "data/" && h.Uid != 65532 {
			t.Errorf("data/ uid = %d, want 65532", h.Uid)
		}
		names = append(names, h.Name)
	}
	if len(names) != 2 || names[0] != "data/" || names[1] != "walship" {
		t.Fatalf("layer entries = %q", names)
	}
}
