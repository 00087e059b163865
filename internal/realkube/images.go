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

// versionVar is the variable `make image` stamps the version into
// (-ldflags -X); `walship version` prints it.
const versionVar = "github.com/walship/walship/app/cli.Version"

// BuildImages builds static pause and walship binaries from the module at
// root and writes their images as OCI archives into dir, returning the
// archives' paths. walship's image matches `make image`: uid 65532 and a
// /data it owns.
func BuildImages(ctx context.Context, root, dir string) ([]string, error) {
	pause, err := buildStatic(ctx, root, dir, "pause", "./internal/realkube/pause", "")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "pause.tar")
	if err := writeImageFile(path, Image{
		Name:       PauseImage,
		Entrypoint: []string{"/pause"},
		User:       "65535:65535",
		Files:      []ImageFile{{Path: "pause", Mode: 0o755, Data: pause}},
	}); err != nil {
		return nil, err
	}
	walship, err := BuildWalshipImage(ctx, root, dir, WalshipImage, "")
	if err != nil {
		return nil, err
	}
	return []string{path, walship}, nil
}

// BuildWalshipImage builds walship's image from the module at root as
// `make image` does, named name, with version stamped into the binary
// ("" leaves the default, "dev"), and writes it as an OCI archive into
// dir, returning the archive's path. Two versions of the same source are
// two builds: their binaries, and so their images' digests, differ.
func BuildWalshipImage(ctx context.Context, root, dir, name, version string) (string, error) {
	file := "walship"
	if version != "" {
		file += "-" + version
	}
	bin, err := buildStatic(ctx, root, dir, file, "./cmd/walship", version)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, file+".tar")
	return path, writeImageFile(path, Image{
		Name:       name,
		Entrypoint: []string{"/walship"},
		Cmd:        []string{"help"},
		User:       "65532:65532",
		Files: []ImageFile{
			{Path: "walship", Mode: 0o755, Data: bin},
			{Path: "data", Mode: 0o755, Dir: true, UID: 65532, GID: 65532},
			// Go's os.TempDir; a FROM scratch image has none otherwise.
			{Path: "tmp", Mode: 0o1777, Dir: true},
		},
	})
}

// buildStatic builds a static binary of pkg into dir/out and returns it;
// a non-empty version is stamped into versionVar.
func buildStatic(ctx context.Context, root, dir, out, pkg, version string) ([]byte, error) {
	ldflags := "-s -w"
	if version != "" {
		ldflags += " -X " + versionVar + "=" + version
	}
	out = filepath.Join(dir, out)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", ldflags, "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build %s: %w\n%s", pkg, err, msg)
	}
	return os.ReadFile(out)
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
