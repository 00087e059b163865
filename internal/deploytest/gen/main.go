// Command gen writes the monitoring manifests that deploy/k8s builds from
// deploy/prometheus/walship-rules.yaml and deploy/grafana/walship.json
// (internal/deploytest is a module of its own; -root is the repository):
//
//	make manifests
//
// internal/deploytest's tests fail when its output differs from the files.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/walship/walship/internal/deploytest"
)

func main() {
	root := flag.String("root", ".", "repository root")
	flag.Parse()
	files, err := deploytest.Generate(*root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
	var paths []string
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if err := os.WriteFile(filepath.Join(*root, p), files[p], 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "gen:", err)
			os.Exit(1)
		}
		fmt.Println("wrote", p)
	}
}
