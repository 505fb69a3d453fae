package importrule

import (
	"encoding/json"
	"io"
	"os/exec"
	"path"
	"strings"
	"testing"
)

const module = "github.com/fleetrepair/fleetrepair"

// edges is the table of import rules (docs/design.md, "Edges"): for the
// packages matching from (a path under the module; "/..." matches the
// package and everything below it), no direct import may match any of
// forbidden, except the packages listed in allow. A rule changes here, in
// one place, and CI checks it (make test).
var edges = []struct {
	name      string
	from      []string
	forbidden []string
	allow     []string // packages of from exempt from the rule
}{
	{
		name:      "pgx only in controller/store",
		from:      []string{"..."},
		forbidden: []string{"github.com/jackc/pgx/..."},
		allow:     []string{"controller/store", "test/pgtest", "test/pgtemp", "test/load"},
	},
	{
		name: "pure decisions: no I/O in diagnose, breaker, catalog, decide",
		from: []string{"controller/diagnose", "controller/breaker", "controller/catalog", "controller/decide"},
		forbidden: []string{"net/...", "os", "os/exec", "database/...", "github.com/jackc/pgx/...",
			"k8s.io/...", "sigs.k8s.io/controller-runtime/...", "net/http"},
		allow: []string{"controller/catalog/gen"}, // the code generator writes files
	},
	{
		// The controller configuration reads its file (os) and nothing
		// else: no network, database or Kubernetes, no package that does
		// I/O (store, kube, repair, shadow), so the simulator can take it.
		name: "controller/config: no network, database or Kubernetes",
		from: []string{"controller/config"},
		forbidden: []string{"net/...", "net/http", "database/...", "github.com/jackc/pgx/...", "k8s.io/...", "sigs.k8s.io/...",
			module + "/controller/store", module + "/controller/kube", module + "/controller/repair", module + "/controller/shadow"},
	},
	{
		name:      "nothing under controller/ imports web/ or cmd/",
		from:      []string{"controller/..."},
		forbidden: []string{module + "/web/...", module + "/cmd/..."},
	},
	{
		name:      "the agent links no controller library, pgx, chi or Kubernetes client",
		from:      []string{"agent/...", "cmd/fleetrepair-agent/..."},
		forbidden: []string{module + "/controller/...", module + "/web/...", "github.com/jackc/pgx/...", "github.com/go-chi/...", "k8s.io/client-go/...", "sigs.k8s.io/controller-runtime/..."},
	},
	{
		name:      "web/api maps the controller's state into its own types",
		from:      []string{"web/..."},
		forbidden: []string{module + "/controller/repair", module + "/controller/runner"},
	},
}

// match reports whether pkg matches pattern ("a/b" exactly, "a/b/..." a/b
// and below, "..." everything).
func match(pattern, pkg string) bool {
	if pattern == "..." {
		return true
	}
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == base || strings.HasPrefix(pkg, base+"/")
	}
	return pkg == pattern
}

type goPackage struct {
	ImportPath string
	Imports    []string
}

// list runs go list -json over patterns (relative to the module root).
func list(t *testing.T, patterns ...string) []goPackage {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json"}, patterns...)...)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v", patterns, err)
	}
	var pkgs []goPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p goPackage
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list %v listed only %d packages", patterns, len(pkgs))
	}
	return pkgs
}

func TestImportEdges(t *testing.T) {
	t.Parallel()
	pkgs := list(t, "./...")
	checked := map[string]int{}
	for _, p := range pkgs {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		for _, e := range edges {
			applies := false
			for _, f := range e.from {
				applies = applies || match(f, rel)
			}
			for _, a := range e.allow {
				applies = applies && !match(a, rel)
			}
			if !applies {
				continue
			}
			checked[e.name]++
			for _, imp := range p.Imports {
				for _, f := range e.forbidden {
					if match(f, imp) {
						t.Errorf("%s imports %s: rule %q", p.ImportPath, imp, e.name)
					}
				}
			}
		}
	}
	for _, e := range edges {
		if checked[e.name] == 0 {
			t.Errorf("rule %q matched no package: its from list is stale", e.name)
		}
	}
}

// TestProductionBinariesLinkNoTestCode: the controller and agent binaries
// link no package under test/ and no client fake (the demo and its fakes
// live in cmd/fleetrepair-demo).
func TestProductionBinariesLinkNoTestCode(t *testing.T) {
	t.Parallel()
	for _, bin := range []string{"./cmd/fleetrepair", "./cmd/fleetrepair-agent"} {
		cmd := exec.Command("go", "list", "-deps", bin)
		cmd.Dir = "../.."
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", bin, err)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 10 {
			t.Fatalf("go list -deps %s listed only %d packages", bin, len(deps))
		}
		for _, d := range deps {
			if strings.HasPrefix(d, module+"/test/") || strings.HasSuffix(d, "/client/fake") || path.Base(d) == "fake" && strings.Contains(d, "k8s.io/client-go") {
				t.Errorf("%s links %s", bin, d)
			}
		}
	}
}
