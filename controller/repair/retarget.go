package repair

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/decide"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// retarget renames open repair rp to the node's headline diagnosis when
// decide.Retarget says so (store.RetargetRepair, audited), and returns the
// repair as stored. A repair that moved meanwhile is an error
// (store.ErrConflict): the work queue retries the node, which reads it
// again.
func (r *Reconciler) retarget(ctx context.Context, rp store.Repair, head diagnose.Diagnosis, now time.Time) (store.Repair, error) {
	if rp.ID == 0 || !decide.Retarget(rp.State, rp.Reason, head) {
		return rp, nil
	}
	why := fmt.Sprintf("the node's headline diagnosis is now %s (was %s): %s", head.Reason, rp.Reason, head.Message)
	out, err := r.cfg.Store.RetargetRepair(ctx, rp, store.Retarget{Reason: head.Reason, FaultClass: head.FaultClass,
		RecommendedAction: string(head.Action)}, Actor, why, now)
	if err != nil {
		return rp, fmt.Errorf("retarget repair %d on %s/%s: %w", rp.ID, rp.Cluster, rp.Node, err)
	}
	r.log.InfoContext(ctx, "repair retargeted", "cluster", rp.Cluster, "node", rp.Node, "repair", rp.ID,
		"from", rp.Reason, "to", head.Reason)
	return out, nil
}
