package datadir

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/walship/walship/internal/vfs"
)

// A cluster id names the cluster a data directory belongs to (PostgreSQL's
// system identifier, etcd's cluster ID, Kafka's cluster.id). The
// cluster's first primary makes it; every other node adopts it from the
// first legitimate peer it hears from, saves it, and from then on refuses
// every peer that states another (docs/ARCHITECTURE.md, "Cluster
// identity"). It is a random (version 4) UUID in its canonical form,
// 36 characters: 8-4-4-4-12 lowercase hex digits.

const (
	clusterFile = "cluster"
	// ClusterIDLen is the length of a cluster id.
	ClusterIDLen = 36
)

// NewClusterID returns a new random cluster id: 122 bits from crypto/rand
// in a version 4 UUID. Two clusters never share one by chance.
func NewClusterID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])  // never fails: crypto/rand crashes the program rather than return an error
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 9562 variant
	var out [ClusterIDLen]byte
	hex.Encode(out[0:8], b[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], b[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], b[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], b[8:10])
	out[23] = '-'
	hex.Encode(out[24:36], b[10:16])
	return string(out[:])
}

// ValidateClusterID checks that id has the form of a cluster id: a UUID
// in canonical form (8-4-4-4-12 lowercase hex digits). Any UUID is
// accepted, not only the version NewClusterID makes, so that an operator
// or a restore may stamp one of its choosing.
func ValidateClusterID(id string) error {
	if len(id) != ClusterIDLen {
		return fmt.Errorf("%s is not a cluster id: want %d characters (a UUID, 8-4-4-4-12 lowercase hex digits), got %d", clip(id), ClusterIDLen, len(id))
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return fmt.Errorf("%s is not a cluster id: want '-' at offset %d (a UUID, 8-4-4-4-12 lowercase hex digits)", clip(id), i)
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return fmt.Errorf("%s is not a cluster id: offset %d is not a lowercase hex digit (a UUID, 8-4-4-4-12 lowercase hex digits)", clip(id), i)
			}
		}
	}
	return nil
}

// clip quotes s for an error message, cut to a length that keeps the
// message readable whatever a peer or a file holds.
func clip(s string) string {
	const most = 48
	if len(s) > most {
		return fmt.Sprintf("%q...", s[:most])
	}
	return fmt.Sprintf("%q", s)
}

// LoadCluster reads dir's cluster id; "" if the directory has none yet
// (a node that has not joined a cluster, or one written before cluster
// ids existed).
func LoadCluster(fsys vfs.FS, dir string) (string, error) {
	path := filepath.Join(dir, clusterFile)
	b, err := vfs.ReadFile(fsys, path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read cluster id: %w", err)
	}
	return ParseCluster(path, b)
}

// ParseCluster parses the file form of a cluster id: the id and a newline
// (surrounding white space is ignored, for a file written by hand). name
// is used in errors.
func ParseCluster(name string, b []byte) (string, error) {
	id := strings.TrimSpace(string(b))
	if id == "" {
		return "", fmt.Errorf("cluster file %s is empty: want one line holding the cluster id", name)
	}
	if err := ValidateClusterID(id); err != nil {
		return "", fmt.Errorf("cluster file %s: %w", name, err)
	}
	return id, nil
}

// SaveCluster durably writes id as dir's cluster id, replacing any:
// callers that adopt an id check first that the directory has none
// (Cluster.Adopt); a restore stamps a new one into the directory it built.
func SaveCluster(fsys vfs.FS, dir, id string) error {
	if err := ValidateClusterID(id); err != nil {
		return fmt.Errorf("save cluster id: %w", err)
	}
	if err := vfs.WriteFileAtomic(fsys, filepath.Join(dir, clusterFile), []byte(id+"\n")); err != nil {
		return fmt.Errorf("save cluster id %s: %w", id, err)
	}
	return nil
}

// Cluster is a running node's cluster id: read from its data directory at
// start, adopted (saved, then published) at most once when it had none.
// Safe for concurrent use.
type Cluster struct {
	fs  vfs.FS
	dir string
	mu  sync.Mutex // serialises Adopt
	id  atomic.Pointer[string]
}

// OpenCluster reads dir's cluster id.
func OpenCluster(fsys vfs.FS, dir string) (*Cluster, error) {
	id, err := LoadCluster(fsys, dir)
	if err != nil {
		return nil, err
	}
	c := &Cluster{fs: fsys, dir: dir}
	c.id.Store(&id)
	return c, nil
}

// ID is the cluster id ("" while the node has none).
func (c *Cluster) ID() string { return *c.id.Load() }

// Adopt makes id the node's cluster id if it has none: saved durably
// first, so that the caller may then act on what came with it. It reports
// whether it adopted id; adopting the id the node already has is a no-op,
// and another one an error (the caller should have refused its sender).
func (c *Cluster) Adopt(id string) (bool, error) {
	if err := ValidateClusterID(id); err != nil {
		return false, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch cur := c.ID(); cur {
	case id:
		return false, nil
	case "":
	default:
		return false, fmt.Errorf("cannot adopt cluster id %s: the data directory belongs to cluster %s", id, cur)
	}
	if err := SaveCluster(c.fs, c.dir, id); err != nil {
		return false, err
	}
	c.id.Store(&id)
	return true, nil
}

// OneClusterID reduces the cluster ids a node heard from its peers (by
// peer name; "" for a peer that has none) to the one they hold: "" if
// none holds one, an error naming every holder if they disagree.
func OneClusterID(ids map[string]string) (string, error) {
	var one string
	holders := map[string][]string{}
	for peer, id := range ids {
		if id == "" {
			continue
		}
		if one == "" {
			one = id
		}
		holders[id] = append(holders[id], peer)
	}
	if len(holders) <= 1 {
		return one, nil
	}
	var parts []string
	for id, peers := range holders {
		slices.Sort(peers)
		parts = append(parts, fmt.Sprintf("%s (%s)", id, strings.Join(peers, ", ")))
	}
	slices.Sort(parts)
	return "", fmt.Errorf("the peers belong to different clusters: %s", strings.Join(parts, "; "))
}
