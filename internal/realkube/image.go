package realkube

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"time"
)

// ImageFile is one regular file or directory of an image's only layer.
type ImageFile struct {
	// Path is relative to the root, without a leading slash ("walship", "data").
	Path string
	// Mode holds the permission bits; Dir makes it a directory.
	Mode int64
	Dir  bool
	UID  int
	GID  int
	Data []byte
}

// Image is a single-layer image FROM scratch: what `make image` builds
// with docker, written here without a daemon or a registry.
type Image struct {
	// Name is the reference containerd records, fully qualified
	// ("docker.io/library/walship:dev"): kubelet looks images up by it.
	Name       string
	Entrypoint []string
	Cmd        []string
	// User is "uid:gid" or empty for root.
	User  string
	Files []ImageFile
}

// epoch fixes every timestamp so that the same inputs give the same digests.
var epoch = time.Unix(0, 0).UTC()

// WriteImage writes img as an OCI image layout tar archive, the format
// `ctr images import` reads. The layer is uncompressed: it only travels to
// a local containerd, and its digest is then also its diff ID.
func WriteImage(w io.Writer, img Image) error {
	layer, err := layerTar(img.Files)
	if err != nil {
		return fmt.Errorf("image %s: layer: %w", img.Name, err)
	}
	layerDesc := descriptor("application/vnd.oci.image.layer.v1.tar", layer)
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      epoch,
		"config": map[string]any{
			"Entrypoint": img.Entrypoint,
			"Cmd":        img.Cmd,
			"User":       img.User,
			"Env":        []string{"PATH=/"},
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDesc.Digest}},
	})
	if err != nil {
		return err
	}
	configDesc := descriptor("application/vnd.oci.image.config.v1+json", config)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        configDesc,
		"layers":        []ociDescriptor{layerDesc},
	})
	if err != nil {
		return err
	}
	manifestDesc := descriptor("application/vnd.oci.image.manifest.v1+json", manifest)
	manifestDesc.Annotations = map[string]string{
		// containerd names the imported image after this annotation.
		"io.containerd.image.name":          img.Name,
		"org.opencontainers.image.ref.name": img.Name,
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []ociDescriptor{manifestDesc},
	})
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	entries := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"blobs/sha256/" + hexOf(layer), layer},
		{"blobs/sha256/" + hexOf(config), config},
		{"blobs/sha256/" + hexOf(manifest), manifest},
		{"index.json", index},
	}
	for _, e := range entries {
		if err := writeTarFile(tw, &tar.Header{Name: e.name, Mode: 0o644}, e.data); err != nil {
			return fmt.Errorf("image %s: %s: %w", img.Name, e.name, err)
		}
	}
	return tw.Close()
}

type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int               `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

func descriptor(mediaType string, blob []byte) ociDescriptor {
	return ociDescriptor{MediaType: mediaType, Digest: "sha256:" + hexOf(blob), Size: len(blob)}
}

func hexOf(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func layerTar(files []ImageFile) ([]byte, error) {
	sorted := append([]ImageFile(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range sorted {
		h := &tar.Header{Name: f.Path, Mode: f.Mode, Uid: f.UID, Gid: f.GID}
		if f.Dir {
			h.Typeflag = tar.TypeDir
			h.Name += "/"
		}
		if err := writeTarFile(tw, h, f.Data); err != nil {
			return nil, fmt.Errorf("%s: %w", f.Path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeTarFile(tw *tar.Writer, h *tar.Header, data []byte) error {
	if h.Typeflag == 0 {
		h.Typeflag = tar.TypeReg
	}
	if h.Typeflag == tar.TypeReg {
		h.Size = int64(len(data))
	}
	h.ModTime = epoch
	h.Format = tar.FormatPAX
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}
