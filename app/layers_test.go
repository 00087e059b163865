package app

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/walship/walship"

// layer is a package's place in the import rule (doc.go); a package may
// import packages of its own layer or a lower one, except that a service
// imports no other service.
type layer int

const (
	leaf layer = iota
	service
	root
	mainPkg
)

func (l layer) String() string {
	return [...]string{"leaf", "service", "composition root", "main"}[l]
}

// serviceImports are the services that import another service: from →
// the services it may import. Shrink this list; do not grow it.
var serviceImports = map[string][]string{
	"services/node": {"services/primary", "services/replica"},
}

func layerOf(pkg string) layer {
	top, _, _ := strings.Cut(pkg, "/")
	switch {
	case top == "cmd":
		return mainPkg
	case top == "app":
		return root
	case top == "services":
		return service
	}
	return leaf
}

// allowed reports whether package from may import package to (both
// relative to the module) under the rule, and if not, why.
func allowed(from, to string) (bool, string) {
	lf, lt := layerOf(from), layerOf(to)
	switch {
	case lt == mainPkg:
		return false, "nothing imports a main"
	case lt > lf:
		return false, "a " + lf.String() + " imports a " + lt.String()
	case lf == service && lt == service && serviceOf(from) != serviceOf(to) && !slices.Contains(serviceImports[serviceOf(from)], serviceOf(to)):
		return false, "a service imports another service"
	}
	return true, ""
}

// serviceOf is the service a package under services/ belongs to
// ("services/primary" for "services/primary/x").
func serviceOf(pkg string) string {
	parts := strings.SplitN(pkg, "/", 3)
	if len(parts) < 2 {
		return pkg
	}
	return parts[0] + "/" + parts[1]
}

// moduleImports returns, for every package of the module (relative path),
// the module's packages its non-test files import.
func moduleImports(t *testing.T, dir string) map[string]map[string]bool {
	t.Helper()
	imports := map[string]map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != dir && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != dir {
				return filepath.SkipDir // another module (tools/)
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, filepath.Dir(path))
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(rel)
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				return err
			}
			to, ok := strings.CutPrefix(p, module+"/")
			if !ok {
				continue
			}
			if imports[pkg] == nil {
				imports[pkg] = map[string]bool{}
			}
			imports[pkg][to] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return imports
}

// TestImportLayers checks the import rule of doc.go over every non-test
// file of the module, and that every listed exception is still needed.
func TestImportLayers(t *testing.T) {
	imports := moduleImports(t, "..")
	if len(imports["app/cli"]) == 0 || len(imports["services/replica"]) == 0 {
		t.Fatalf("found no imports of app/cli or services/replica: is %q the module root?", "..")
	}
	used := map[string]bool{}
	for from, tos := range imports {
		for to := range tos {
			if ok, why := allowed(from, to); !ok {
				t.Errorf("%s imports %s: %s (rule: app/doc.go)", from, to, why)
			}
			if layerOf(from) == service && layerOf(to) == service && serviceOf(from) != serviceOf(to) {
				used[serviceOf(from)+" → "+serviceOf(to)] = true
			}
		}
	}
	for from, tos := range serviceImports {
		for _, to := range tos {
			if !used[from+" → "+to] {
				t.Errorf("serviceImports lists %s → %s, which no longer imports it: remove it", from, to)
			}
		}
	}
}

// TestAllowed pins the rule itself.
func TestAllowed(t *testing.T) {
	for _, tc := range []struct {
		from, to string
		ok       bool
	}{
		{"cmd/walship", "app/cli", true},
		{"app/cli", "services/replica", true},
		{"app/cli", "app/cluster", true},
		{"app/bench", "internal/serve", true},
		{"app/cluster", "services/primary", true},
		{"services/replica", "internal/wal", true},
		{"services/replica/x", "services/replica", true},
		{"services/node", "services/replica", true},
		{"internal/serve", "internal/tlsid", true},
		{"pkg/client", "internal/backoff", true},
		{"internal/wal", "services/primary", false},
		{"pkg/client", "services/primary", false},
		{"internal/serve", "app/cli", false},
		{"services/replica", "app/cli", false},
		{"services/replica", "app/cluster", false},
		{"services/replica", "services/primary", false},
		{"services/logstore", "services/node", false},
		{"app/cli", "cmd/walship", false},
	} {
		if ok, why := allowed(tc.from, tc.to); ok != tc.ok {
			t.Errorf("allowed(%s, %s) = %t (%s), want %t", tc.from, tc.to, ok, why, tc.ok)
		}
	}
}
