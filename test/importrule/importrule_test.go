// Package importrule checks the import rules of docs/design.md ("Edges"): the node agent
// never depends on controller code, pgx, chi, client-go or controller-runtime,
// so its binary stays small and its attack surface too.
package importrule

import (
	"os/exec"
	"strings"
	"testing"
)

var forbidden = []string{
	"github.com/fleetrepair/fleetrepair/controller",
	"github.com/fleetrepair/fleetrepair/web",
	"github.com/jackc/pgx",
	"github.com/go-chi/chi",
	"k8s.io/client-go",
	"sigs.k8s.io/controller-runtime",
}

func TestAgentImports(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "../../cmd/fleetrepair-agent/...", "../../agent/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed only %d packages: %s", len(deps), out)
	}
	for _, d := range deps {
		for _, f := range forbidden {
			if strings.HasPrefix(d, f) {
				t.Errorf("the agent depends on %s (forbidden prefix %s)", d, f)
			}
		}
	}
}
