package realkube

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/walship/walship/internal/check"
)

// TestImageUpgrade rolls both StatefulSets from one walship build to
// another (kubectl set image, the log stores first, then the data nodes)
// under the checked workload: old and new versions run side by side
// during the roll, at most one data node is down at once, nothing
// acknowledged is lost, and every pod ends on the new image, running the
// new build.
func TestImageUpgrade(t *testing.T) {
	c := cluster(t)
	deployDev(t, c)
	defer dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	// The build the upgrade rolls to: the same source as what runs, with
	// another version stamped into the binary, so another image digest.
	// Each run rolls to a new one (-count=N upgrades N times).
	upgradeVersion := fmt.Sprintf("realkube-upgrade-%d", time.Now().UnixNano())
	upgradeImage := "docker.io/library/walship:" + upgradeVersion
	// Build and import the new image before the load: a user's registry
	// has it before the roll starts.
	dir := t.TempDir()
	root, _ := filepath.Abs("../..")
	archive, err := BuildWalshipImage(ctx, root, dir, upgradeImage, upgradeVersion)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ImportImage(ctx, archive); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(archive)

	sets := []struct{ sts, container, selector string }{
		{"walship-logstore", "logstore", "app.kubernetes.io/component=logstore"},
		{"walship", "node", nodeSelector},
	}
	before := map[string]string{}
	for _, s := range sets {
		pods, err := podsWith(ctx, c, s.selector)
		if err != nil || len(pods) == 0 {
			t.Fatalf("%s's pods: %v, %v", s.sts, pods, err)
		}
		for _, pod := range pods {
			v, err := podVersion(ctx, c, pod, s.container)
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(v, "walship "+upgradeVersion+" ") {
				t.Fatalf("%s already runs %q before the upgrade", pod, v)
			}
			before[pod] = v
		}
	}

	var nodesDown int
	// Old and new side by side: data nodes on the new log stores, and
	// within the data nodes' roll, a new replica streaming from an old
	// primary (or the reverse).
	var mixed, mixedNodes mixedWatch
	underLoad(t, c, "image-upgrade", func(ctx context.Context, h *check.History) error {
		stopMixed := mixed.start(ctx, c, "app.kubernetes.io/name=walship")
		defer stopMixed()
		stopMixedNodes := mixedNodes.start(ctx, c, nodeSelector)
		defer stopMixedNodes()
		for _, s := range sets {
			var watch *unavailableWatch
			if s.sts == "walship" {
				pods, err := podsWith(ctx, c, s.selector)
				if err != nil {
					return err
				}
				watch = watchUnavailable(ctx, c, s.selector, len(pods))
			}
			h.Note("kubectl set image statefulset/%s %s=%s", s.sts, s.container, upgradeImage)
			if err := c.Kubectl(ctx, nil, "-n", devNamespace, "set", "image", "statefulset/"+s.sts, s.container+"="+upgradeImage); err != nil {
				return err
			}
			err := c.Kubectl(ctx, nil, "-n", devNamespace, "rollout", "status", "statefulset/"+s.sts, "--timeout=10m")
			if watch != nil {
				nodesDown, _ = watch.stop()
			}
			if err != nil {
				return err
			}
			h.Note("statefulset/%s rolled out", s.sts)
		}
		return waitAllReady(ctx, c, 5*time.Minute)
	})
	if t.Failed() {
		return
	}

	for _, s := range sets {
		pods, err := podsWith(ctx, c, s.selector)
		if err != nil {
			t.Fatal(err)
		}
		for _, pod := range pods {
			img, err := podField(ctx, c, pod, "{.status.containerStatuses[0].image}")
			if err != nil || img != upgradeImage {
				t.Errorf("%s runs image %q (%v), want %s", pod, img, err, upgradeImage)
			}
			v, err := podVersion(ctx, c, pod, s.container)
			if err != nil {
				t.Error(err)
				continue
			}
			if !strings.HasPrefix(v, "walship "+upgradeVersion+" ") {
				t.Errorf("%s's walship version after the upgrade: %q, want %s", pod, v, upgradeVersion)
			}
			t.Logf("%s: %q → %q", pod, before[pod], v)
		}
	}
	if nodesDown > 1 {
		t.Errorf("%d data nodes were down at once during the upgrade, want at most 1", nodesDown)
	}
	most, seen := mixed.result()
	mostNodes, seenNodes := mixedNodes.result()
	t.Logf("image upgrade: at most %d data node(s) down at once; images running side by side: %s; among the data nodes: %s", nodesDown, seen, seenNodes)
	if most < 2 || mostNodes < 2 {
		t.Errorf("never saw old and new images running at once during the roll (most distinct images at once: %d, among the data nodes: %d)", most, mostNodes)
	}
}

// podVersion runs `walship version` in a pod's container (kubectl exec;
// the image has no shell, the binary is all there is).
func podVersion(ctx context.Context, c *Cluster, pod, container string) (string, error) {
	out, err := c.KubectlOutput(ctx, nil, "-n", devNamespace, "exec", pod, "-c", container, "--", "/walship", "version")
	if err != nil {
		return "", fmt.Errorf("%s: walship version: %w", pod, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// mixedWatch polls the images that the started containers of the pods with
// a label selector run and keeps the most distinct ones seen at once, with
// which pods ran them.
type mixedWatch struct {
	mu   sync.Mutex
	most int
	seen string
}

func (m *mixedWatch) start(ctx context.Context, c *Cluster, selector string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			out, err := c.KubectlOutput(ctx, nil, "-n", devNamespace, "get", "pods", "-l", selector, "-o",
				`jsonpath={range .items[*]}{.metadata.name}|{.status.containerStatuses[0].started}|{.status.containerStatuses[0].image}{"\n"}{end}`)
			if err == nil {
				byImage := map[string][]string{}
				for _, line := range strings.Split(string(out), "\n") {
					f := strings.Split(line, "|")
					if len(f) == 3 && f[1] == "true" {
						byImage[f[2]] = append(byImage[f[2]], f[0])
					}
				}
				m.mu.Lock()
				if len(byImage) > m.most {
					var parts []string
					for img, pods := range byImage {
						sort.Strings(pods)
						parts = append(parts, fmt.Sprintf("%s on %s", img, strings.Join(pods, ",")))
					}
					sort.Strings(parts)
					m.most, m.seen = len(byImage), strings.Join(parts, "; ")
				}
				m.mu.Unlock()
			}
			t := time.NewTimer(200 * time.Millisecond)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
	}()
	return func() { cancel(); wg.Wait() }
}

func (m *mixedWatch) result() (int, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.most, m.seen
}
