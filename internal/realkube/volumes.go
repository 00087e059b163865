package realkube

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// LocalStorageClass is the StorageClass of the test overlay
// (testdata/overlay): statically provisioned local volumes.
const LocalStorageClass = "realkube-local"

// CreateLocalPVs creates n local PersistentVolumes of size in
// LocalStorageClass, each a directory under the cluster's volumes/, as an
// administrator (or a local-volume provisioner) does before a StatefulSet
// claims them. The directories are root's and 0755, as a provisioner
// leaves them: the pods' fsGroup must make them writable. It returns the
// directories.
func (c *Cluster) CreateLocalPVs(ctx context.Context, n int, size string) ([]string, error) {
	return c.CreateLocalPVsIn(ctx, LocalStorageClass, "realkube-pv", n, size)
}

// CreateLocalPVsIn is CreateLocalPVs in StorageClass class, the volumes
// named prefix-0, prefix-1, ...: a second deployment's volumes, which the
// first one's claims never take.
func (c *Cluster) CreateLocalPVsIn(ctx context.Context, class, prefix string, n int, size string) ([]string, error) {
	var dirs []string
	for i := 0; i < n; i++ {
		dir, err := c.createLocalPV(ctx, fmt.Sprintf("%s-%d", prefix, i), class, size)
		if err != nil {
			return nil, err
		}
		dirs = append(dirs, dir)
	}
	return dirs, nil
}

// CreateLocalPV creates one empty local PersistentVolume, as
// CreateLocalPVs does, and returns its directory: the disk a replaced
// machine comes back with.
func (c *Cluster) CreateLocalPV(ctx context.Context, name, size string) (string, error) {
	return c.createLocalPV(ctx, name, LocalStorageClass, size)
}

func (c *Cluster) createLocalPV(ctx context.Context, name, class, size string) (string, error) {
	dir := filepath.Join(c.cfg.Dir, "volumes", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	pv := fmt.Sprintf(`apiVersion: v1
kind: PersistentVolume
metadata:
  name: %s
spec:
  capacity: {storage: %s}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: %s
  local: {path: %s}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {key: kubernetes.io/hostname, operator: In, values: [%s]}
`, name, size, class, dir, NodeName)
	return dir, c.Kubectl(ctx, strings.NewReader(pv), "apply", "-f", "-")
}
