package runner

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaderElection configures per-cluster leader election with a
// coordination.k8s.io Lease in each cluster. It only keeps background loops
// from running twice; correctness never depends on it.
type LeaderElection struct {
	// Clients maps each cluster to a clientset for its Lease.
	Clients map[string]kubernetes.Interface
	// Namespace of the Lease ("fleetrepair-controller" in it).
	Namespace string
	// Identity of this replica (pod name).
	Identity string
	// LeaseDuration, RenewDeadline, RetryPeriod: client-go's defaults are
	// 15s, 10s, 2s when zero.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// LeaseName is the name of the controller's Lease in each cluster.
const LeaseName = "fleetrepair-controller"

// runElection campaigns for cluster's Lease until ctx ends, reporting
// leadership changes to set. Losing a lease never stops the process: the
// replica keeps serving the API and campaigns again.
func runElection(ctx context.Context, le LeaderElection, cluster string, cs kubernetes.Interface, set func(string, bool)) error {
	d := func(v, def time.Duration) time.Duration {
		if v > 0 {
			return v
		}
		return def
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: LeaseName, Namespace: le.Namespace},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: le.Identity},
	}
	cfg := leaderelection.LeaderElectionConfig{
		Lock: lock, Name: LeaseName + "/" + cluster, ReleaseOnCancel: true,
		LeaseDuration: d(le.LeaseDuration, 15*time.Second),
		RenewDeadline: d(le.RenewDeadline, 10*time.Second),
		RetryPeriod:   d(le.RetryPeriod, 2*time.Second),
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { set(cluster, true) },
			OnStoppedLeading: func() { set(cluster, false) },
		},
	}
	elector, err := leaderelection.NewLeaderElector(cfg)
	if err != nil {
		return fmt.Errorf("leader election for cluster %s: %w", cluster, err)
	}
	for ctx.Err() == nil {
		elector.Run(ctx) // returns when leadership is lost or ctx ends
	}
	return nil
}
