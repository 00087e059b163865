package realkube

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// The images the cluster runs. kubelet never pulls them (imagePullPolicy
// Never in the test overlay, and the pause image is containerd's sandbox
// image), so the names only have to match what is imported.
const (
	PauseImage   = "registry.k8s.io/pause:walship"
	WalshipImage = "docker.io/library/walship:dev"
)

// BuildImages builds static pause and walship binaries from the module at
// root and writes their images as OCI archives into dir, returning the
// archives' paths. walship's image matches `make image`: uid 65532 and a
// /data it owns.
func BuildImages(ctx context.Context, root, dir string) ([]string, error) {
	bins := map[string]string{
		"pause":   "./internal/realkube/pause",
		"walship": "./cmd/walship",
	}
	built := map[string][]byte{}
	for name, pkg := range bins {
		out := filepath.Join(dir, name)
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if msg, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build %s: %w\n%s", pkg, err, msg)
		}
		data, err := os.ReadFile(out)
		if err != nil {
			return nil, err
		}
		built[name] = data
	}
	images := map[string]Image{
		"pause.tar": {
			Name:       PauseImage,
			Entrypoint: []string{"/pause"},
			User:       "65535:65535",
			Files:      []ImageFile{{Path: "pause", Mode: 0o755, Data: built["pause"]}},
		},
		"walship.tar": {
			Name:       WalshipImage,
			Entrypoint: []string{"/walship"},
			Cmd:        []string{"help"},
			User:       "65532:65532",
			Files: []ImageFile{
				{Path: "walship", Mode: 0o755, Data: built["walship"]},
				{Path: "data", Mode: 0o755, Dir: true, UID: 65532, GID: 65532},
				// Go's os.TempDir; a FROM scratch image has none otherwise.
				{Path: "tmp", Mode: 0o1777, Dir: true},
			},
		},
	}
	var paths []string
	for file, img := range images {
		path := filepath.Join(dir, file)
		if err := writeImageFile(path, img); err != nil {
			return nil, err
		}
		paths = append(paths, path)
	}
	return paths, nil
}

func writeImageFile(path string, img Image) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := WriteImage(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
