package repair

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// Replacement verification (issue #5): after a NodeClaim is gone, the
// controller looks for the Node Karpenter launched in its place (the
// earliest Node of the same NodePool created after the deletion started,
// not already the replacement of another repair) and records, on the
// repair, which Node it is and how long the replacement took until it was
// Ready with no active condition diagnosis. A replacement not healthy
// within VerifyTimeout is recorded as failed: on-call sees it in the repair
// and the metric. (Backing off a cohort whose replacements keep failing
// under its own breaker reason is not built yet.)

// DefaultVerifyTimeout bounds the wait for a healthy replacement.
const DefaultVerifyTimeout = 15 * time.Minute

// verifyReplacements checks every recently replaced repair not verified yet.
func (r *Reconciler) verifyReplacements(ctx context.Context, fleet map[string][]kube.NodeInfo) error {
	now := r.cfg.Now()
	rs, err := r.cfg.Store.RepairsInState(ctx, ledger.Replaced)
	if err != nil {
		return fmt.Errorf("verify replacements: %w", err)
	}
	taken := map[string]bool{}
	var todo []store.Repair
	for _, rp := range rs {
		if n, ok := rp.Detail["replacement_node"].(string); ok {
			taken[rp.Cluster+"/"+n] = true
			continue
		}
		if rp.Detail["replacement_verified"] != nil || now.Sub(rp.ClosedAt) > 2*DefaultVerifyTimeout {
			continue
		}
		todo = append(todo, rp)
	}
	sort.Slice(todo, func(i, j int) bool { return todo[i].ClosedAt.Before(todo[j].ClosedAt) })
	for _, rp := range todo {
		nodes, reachable := fleet[rp.Cluster]
		if !reachable || !r.leads(rp.Cluster) {
			continue
		}
		if err := r.verify(ctx, nodes, rp, taken, now); err != nil {
			r.log.ErrorContext(ctx, "verify replacement", "cluster", rp.Cluster, "repair", rp.ID, "err", err)
		}
	}
	return nil
}

func (r *Reconciler) verify(ctx context.Context, nodes []kube.NodeInfo, rp store.Repair, taken map[string]bool, now time.Time) error {
	audit, err := r.cfg.Store.RepairAudit(ctx, rp.ID)
	if err != nil {
		return err
	}
	var started time.Time
	for _, a := range audit {
		if a.To == ledger.Deleting {
			started = a.At
		}
	}
	var cand *kube.NodeInfo
	for i := range nodes {
		n := &nodes[i]
		if n.NodePool != rp.NodePool || n.Name == rp.Node || taken[rp.Cluster+"/"+n.Name] || n.Created.Before(started.Add(-time.Second)) {
			continue
		}
		if cand == nil || n.Created.Before(cand.Created) {
			cand = n
		}
	}
	if cand != nil && cand.Ready {
		active, err := r.cfg.Store.ActiveDiagnoses(ctx, rp.Cluster, cand.Name)
		if err != nil {
			return err
		}
		healthy := true
		for _, d := range active {
			if d.Severity == "condition" {
				healthy = false
			}
		}
		if healthy {
			took := now.Sub(started)
			taken[rp.Cluster+"/"+cand.Name] = true
			r.timeToReplace.Observe(took.Seconds())
			return r.cfg.Store.NoteRepair(ctx, rp.ID, Actor, fmt.Sprintf("replacement %s is Ready and healthy, %s after the deletion started", cand.Name, took.Round(time.Second)),
				map[string]any{"replacement_node": cand.Name, "replacement_verified": true, "time_to_replace_seconds": took.Seconds()}, now)
		}
	}
	if now.Sub(started) < r.verifyTimeout() {
		return nil // keep waiting
	}
	r.replacementsFailed.Inc()
	why := "no replacement Node registered in NodePool " + rp.NodePool
	if cand != nil {
		why = "replacement " + cand.Name + " is not Ready and healthy"
	}
	r.log.WarnContext(ctx, "replacement not healthy in time", "cluster", rp.Cluster, "node", rp.Node, "repair", rp.ID, "why", why)
	return r.cfg.Store.NoteRepair(ctx, rp.ID, Actor, fmt.Sprintf("%s within %s of the deletion", why, r.verifyTimeout()),
		map[string]any{"replacement_verified": false, "replacement_problem": why}, now)
}

func (r *Reconciler) verifyTimeout() time.Duration {
	if r.cfg.VerifyTimeout > 0 {
		return r.cfg.VerifyTimeout
	}
	return DefaultVerifyTimeout
}
