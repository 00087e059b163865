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
	var dirs []string
	for i := 0; i < n; i++ {
		dir, err := c.CreateLocalPV(ctx, fmt.Sprintf("realkube-pv-%d", i), size)
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
`, name, size, LocalStorageClass, dir, NodeName)
	return dir, c.Kubectl(ctx, strings.NewReader(pv), "apply", "-f", "-")
}
