package lifecycle

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/awslabs/operatorpkg/status"

	"github.com/fleetrepair/fleetrepair/test/casecheck"
)

const casesDir = "../../test/fixtures/cases"

// TestCaseC27 reads the case's saved NodeClaim and Node (the Node's name is
// masked as ***, which a strict YAML parser reads as an alias) and compares
// the lifecycle findings with the expected ones.
func TestCaseC27(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(casesDir, "c27-nodeclaim-stuck-terminating")
	read := func(name string, v any) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := DecodeLenient(b, v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	var nc karpv1.NodeClaim
	read("input.nodeclaim.yaml", &nc)
	var n corev1.Node
	read("input.node.yaml", &n)
	if n.Name != "***" || !Terminating(&n) {
		t.Fatalf("node %q terminating=%v", n.Name, Terminating(&n))
	}
	casecheck.CompareFindings(t, []map[string]any{{"detector": "nodeclaim-status", "deletion_timestamp": "2025-04-21T19:27:22Z",
		"finalizers": []any{"karpenter.sh/termination"}, "count": float64(1)}}, NodeClaimFindings(&nc))
	casecheck.CompareFindings(t, []map[string]any{{"detector": "node-terminating", "deletion_timestamp": "2025-04-21T19:27:22Z",
		"count": float64(1)}}, NodeFindings(&n))
}

func TestNodeClaimFindings(t *testing.T) {
	t.Parallel()
	cond := func(typ, st, reason string) status.Condition {
		return status.Condition{Type: typ, Status: metav1.ConditionStatus(st), Reason: reason, LastTransitionTime: metav1.Now()}
	}
	nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "gpu-abc"}}
	nc.Status.Conditions = []status.Condition{cond("Launched", "True", "Launched"), cond("Registered", "True", "Registered"),
		cond("Initialized", "True", "Initialized"), cond("Ready", "True", "Ready")}
	if fs := NodeClaimFindings(nc); len(fs) != 0 {
		t.Fatalf("healthy NodeClaim: %+v", fs)
	}
	nc.Status.Conditions[1] = cond("Registered", "Unknown", "NodeNotFound")
	fs := NodeClaimFindings(nc)
	if len(fs) != 1 || fs[0].Attrs["registered"] != "Unknown" || fs[0].Attrs["registered_reason"] != "NodeNotFound" || fs[0].Attrs["launched"] != "True" {
		t.Fatalf("unregistered: %+v", fs)
	}
	nc.Status.Conditions[1] = cond("Registered", "True", "Registered")
	nc.Status.Conditions = append(nc.Status.Conditions, cond("Drifted", "True", "AMIDrift"))
	if fs := NodeClaimFindings(nc); len(fs) != 1 || fs[0].Attrs["drifted"] != "true" {
		t.Fatalf("drifted: %+v", fs)
	}
	now := metav1.NewTime(time.Date(2025, 4, 21, 19, 27, 22, 0, time.UTC))
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", DeletionTimestamp: &now}}
	if fs := NodeFindings(n); len(fs) != 1 || fs[0].Attrs["deletion_timestamp"] != "2025-04-21T19:27:22Z" {
		t.Fatalf("terminating node: %+v", fs)
	}
	n.DeletionTimestamp = nil
	if fs := NodeFindings(n); fs != nil || Terminating(n) {
		t.Fatalf("live node: %+v", fs)
	}
}
