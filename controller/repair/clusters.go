package repair

import (
	"errors"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/kube"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// ClusterState is what the controller last saw of a cluster's API server.
type ClusterState struct {
	Name      string    `json:"name"`
	Reachable bool      `json:"reachable"`
	Since     time.Time `json:"since"` // when Reachable last changed
	LastError string    `json:"lastError,omitempty"`
	Leading   *bool     `json:"leading,omitempty"` // nil: leader election off
}

// observe records a call's outcome against cluster's API server. NotFound
// and conflicts are answers, so they count as reachable.
func (r *Reconciler) observe(cluster string, err error) {
	reachable := err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) || errors.Is(err, kube.ErrNoNodeClaim) || errors.Is(err, kube.ErrUIDChanged)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.clusters == nil {
		r.clusters = map[string]ClusterState{}
	}
	st, seen := r.clusters[cluster]
	if !seen || st.Reachable != reachable {
		st = ClusterState{Name: cluster, Reachable: reachable, Since: r.cfg.Now()}
		if !reachable {
			r.log.Warn("cluster API server unreachable: its nodes are unknown, no repair acts there", "cluster", cluster, "err", err)
		}
	}
	st.LastError = ""
	if !reachable {
		st.LastError = err.Error()
	}
	r.clusters[cluster] = st
}

// Clusters returns the state of every configured cluster, sorted by name.
// A cluster not contacted yet is reported unreachable since the start.
func (r *Reconciler) Clusters() []ClusterState {
	names := r.ClusterNames()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ClusterState, 0, len(names))
	for _, name := range names {
		st, ok := r.clusters[name]
		if !ok {
			st = ClusterState{Name: name, LastError: "not contacted yet"}
		}
		if r.leading != nil {
			l := r.leading[name]
			st.Leading = &l
		}
		out = append(out, st)
	}
	return out
}

// knownUnreachable reports whether cluster's API server failed the last
// call (not merely: not contacted yet).
func (r *Reconciler) knownUnreachable(cluster string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, seen := r.clusters[cluster]
	return seen && !st.Reachable
}

// Reachable reports whether cluster's API server answered the last call.
func (r *Reconciler) Reachable(cluster string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.clusters[cluster].Reachable
}

// UseLeaderElection makes each cluster's reconciles and periodic pass run
// only on the replica holding its Lease (SetLeading). A report ingested by
// another replica reaches the leader through PostgreSQL (Trigger forwards
// it with NOTIFY; Run listens), and every pass catches up on nodes with new
// findings, so a lost notification or a crashed replica delays a reconcile
// by one Resync at most. Correctness still lives in the ledger's
// compare-and-set transitions and the guard transaction (docs/design.md):
// election only keeps the work in one place.
func (r *Reconciler) UseLeaderElection() {
	r.mu.Lock()
	if r.leading == nil {
		r.leading = map[string]bool{}
	}
	r.mu.Unlock()
}

// SetLeading records whether this replica leads cluster.
func (r *Reconciler) SetLeading(cluster string, leading bool) {
	r.mu.Lock()
	if r.leading == nil {
		r.leading = map[string]bool{}
	}
	was := r.leading[cluster]
	r.leading[cluster] = leading
	if leading && !was {
		// A new leader does not know what the old one had queued: the next
		// pass catches up on every node with findings in the last
		// CatchUpLookback, the freshest at PriorityEvidence (catchUp), and
		// it runs now, not at the next Resync: in a failover mid-wave the
		// wave's triggers were lost with the old leader.
		r.resetCatchUpLocked(time.Time{})
	}
	r.mu.Unlock()
	if leading && !was {
		r.PassSoon()
	}
	r.log.Info("leader election", "cluster", cluster, "leading", leading)
}

func (r *Reconciler) leads(cluster string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leadsLocked(cluster)
}

// leadsLocked is leads with r.mu held.
func (r *Reconciler) leadsLocked(cluster string) bool { return r.leading == nil || r.leading[cluster] }
