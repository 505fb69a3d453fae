package repair

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrepair/fleetrepair/controller/kube"
)

// ErrUnknownCluster is returned by ReconcileNode for a cluster the
// reconciler does not serve (never configured, or removed since the node
// was queued).
var ErrUnknownCluster = errors.New("cluster is not configured")

// member is one served cluster: its Kubernetes access and, once its cache
// runs, the function that stops it.
type member struct {
	k    *kube.Cluster
	stop context.CancelFunc
}

// AddCluster makes the reconciler serve cluster name through k from now on:
// its informer cache starts (at once when Run is running, else with Run)
// and the next pass covers its nodes. A cluster already served under name is
// replaced: its cache stops first (a rotated credential). Clusters picked up
// at run time come from kubeconfig Secrets (controller/remote); the ones
// given at start are in Config.Clusters.
func (r *Reconciler) AddCluster(name string, k *kube.Cluster) error {
	if name == "" || k == nil {
		return errors.New("add cluster: name and Kubernetes access are required")
	}
	r.membersMu.Lock()
	defer r.membersMu.Unlock()
	if old, ok := r.members[name]; ok {
		if old.stop != nil {
			old.stop()
		}
		r.cfg.Events.Forget(old.k) // its Events broadcaster writes through the old credential
	}
	m := &member{k: k}
	r.members[name] = m
	if r.runCtx != nil {
		r.startMemberLocked(name, m)
	}
	r.log.Info("serving cluster", "cluster", name)
	r.PassSoon() // its open repairs and new findings are picked up, its breakers evaluated
	return nil
}

// RemoveCluster stops serving cluster name: its cache stops, queued nodes
// of it are dropped by the workers and the breakers no longer count it.
// Its ledger (open repairs, audit) stays in PostgreSQL untouched; adding the
// cluster again resumes them. Removing an unknown cluster does nothing.
func (r *Reconciler) RemoveCluster(name string) {
	r.membersMu.Lock()
	m, ok := r.members[name]
	delete(r.members, name)
	r.membersMu.Unlock()
	if !ok {
		return
	}
	if m.stop != nil {
		m.stop()
	}
	r.cfg.Events.Forget(m.k)
	r.mu.Lock()
	delete(r.clusters, name)
	delete(r.claims, name)
	r.mu.Unlock()
	r.claimGauge.DeletePartialMatch(prometheus.Labels{"cluster": name})
	r.log.Info("stopped serving cluster", "cluster", name)
}

// startMemberLocked runs m's informer cache under the context of Run until
// the cluster is removed or replaced, and asks for a periodic pass once it
// has synced. A cache that fails to start is logged and marks the cluster
// unreachable; it stops no other cluster.
// r.membersMu is held.
func (r *Reconciler) startMemberLocked(name string, m *member) {
	ctx, stop := context.WithCancel(r.runCtx)
	m.stop = stop
	go func() {
		if err := m.k.Run(ctx, func(node string) { r.Trigger(name, node) }); err != nil && ctx.Err() == nil {
			r.observe(name, fmt.Errorf("start cache: %w", err))
		}
	}()
	go func() {
		// The first pass on a synced cache: the cluster is reachable at
		// once, its breakers evaluated and its removed nodes swept
		// (sweepRemoved), not a Resync later.
		if m.k.WaitSynced(ctx) {
			r.PassSoon()
		}
	}()
}

// startMembers starts the cache of every member under ctx (Run).
func (r *Reconciler) startMembers(ctx context.Context) {
	r.membersMu.Lock()
	defer r.membersMu.Unlock()
	r.runCtx = ctx
	for name, m := range r.members {
		r.startMemberLocked(name, m)
	}
}

// kubeFor returns the Kubernetes access of cluster name (nil: not served).
func (r *Reconciler) kubeFor(name string) *kube.Cluster {
	r.membersMu.RLock()
	defer r.membersMu.RUnlock()
	if m, ok := r.members[name]; ok {
		return m.k
	}
	return nil
}

// Serves reports whether cluster name is served now.
func (r *Reconciler) Serves(name string) bool { return r.kubeFor(name) != nil }

// memberSnapshot returns the served clusters at this moment, by name.
func (r *Reconciler) memberSnapshot() map[string]*kube.Cluster {
	r.membersMu.RLock()
	defer r.membersMu.RUnlock()
	out := make(map[string]*kube.Cluster, len(r.members))
	for name, m := range r.members {
		out[name] = m.k
	}
	return out
}

// ClusterNames returns the served clusters' names, sorted.
func (r *Reconciler) ClusterNames() []string {
	r.membersMu.RLock()
	defer r.membersMu.RUnlock()
	out := make([]string, 0, len(r.members))
	for name := range r.members {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}
