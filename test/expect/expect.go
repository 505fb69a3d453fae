// Package expect holds test assertions on the repair ledger and the
// NodeClaims it deletes, in the style of Karpenter's pkg/test/expectations:
// each Expect* reads the state, fails the test with what it found, and
// returns what a test goes on with. Tests only.
package expect

import (
	"context"
	"fmt"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// Transition is one audit entry's states.
type Transition struct{ From, To ledger.State }

// Path returns the states an audit passed through: each entry's To, notes
// that keep the state (the replacement's verification) left out.
func Path(ts []Transition) []ledger.State {
	var out []ledger.State
	for _, t := range ts {
		if t.From != t.To {
			out = append(out, t.To)
		}
	}
	return out
}

// ExpectPath fails t unless the audit ts passed through exactly want.
func ExpectPath(t testing.TB, ts []Transition, want ...ledger.State) {
	t.Helper()
	if got := Path(ts); !slices.Equal(got, want) {
		t.Fatalf("audit path = %v, want %v", got, want)
	}
}

// ExpectAuditPath fails t unless repair id's stored audit passed through
// exactly want (see Path).
func ExpectAuditPath(t testing.TB, st *store.Store, id int64, want ...ledger.State) {
	t.Helper()
	audit, err := st.RepairAudit(context.Background(), id)
	if err != nil {
		t.Fatalf("read audit of repair %d: %v", id, err)
	}
	ts := make([]Transition, len(audit))
	for i, a := range audit {
		ts[i] = Transition{From: a.From, To: a.To}
	}
	ExpectPath(t, ts, want...)
}

// ExpectRepairState fails t unless the node's newest repair is in state
// want, and returns it.
func ExpectRepairState(t testing.TB, st *store.Store, cluster, node string, want ledger.State) store.Repair {
	t.Helper()
	rs, _, err := st.ListRepairs(context.Background(), store.RepairFilter{Cluster: cluster, Node: node, Limit: 1})
	if err != nil {
		t.Fatalf("list repairs of %s/%s: %v", cluster, node, err)
	}
	if len(rs) == 0 {
		t.Fatalf("%s/%s has no repair, want one in state %s", cluster, node, want)
	}
	if rs[0].State != want {
		t.Fatalf("%s/%s repair %d is %s (%v), want %s", cluster, node, rs[0].ID, rs[0].State, rs[0].Detail, want)
	}
	return rs[0]
}

// NodeClaimDeleting reports whether NodeClaim name is gone or has a
// deletion timestamp.
func NodeClaimDeleting(t testing.TB, c client.Client, name string) bool {
	t.Helper()
	var nc karpv1.NodeClaim
	err := c.Get(context.Background(), client.ObjectKey{Name: name}, &nc)
	if apierrors.IsNotFound(err) {
		return true
	}
	if err != nil {
		t.Fatalf("get NodeClaim %s: %v", name, err)
	}
	return nc.DeletionTimestamp != nil
}

// ExpectNodeClaimDeleting fails t unless NodeClaim name is gone or being
// deleted.
func ExpectNodeClaimDeleting(t testing.TB, c client.Client, name string) {
	t.Helper()
	if !NodeClaimDeleting(t, c, name) {
		t.Fatalf("NodeClaim %s is not being deleted", name)
	}
}

// ExpectNodeClaimNotDeleting fails t when NodeClaim name is gone or being
// deleted; why says what should have kept it.
func ExpectNodeClaimNotDeleting(t testing.TB, c client.Client, name string, why ...any) {
	t.Helper()
	if NodeClaimDeleting(t, c, name) {
		t.Fatalf("NodeClaim %s deleted %s", name, fmt.Sprint(why...))
	}
}
