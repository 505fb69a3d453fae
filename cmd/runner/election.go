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
	// LeaseDuration, RenewDeadline, RetryPeriod: the Lease's timings
	// (client-go tools/leaderelection); zero takes DefaultLeaseDuration,
	// DefaultRenewDeadline, DefaultRetryPeriod. A cluster whose leader dies
	// is reconciled again at most LeaseDuration (plus a RetryPeriod) later:
	// in a wave, the breaker's trip waits that long (docs/scale.md).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// The default Lease timings: client-go's and kube-controller-manager's
// (LeaseDuration 15s, RenewDeadline 10s, RetryPeriod 2s).
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// TimingError is CheckTimings' refusal of one Lease timing.
type TimingError struct {
	// Timing is "lease duration", "renew deadline" or "retry period".
	Timing string
	Value  time.Duration
	// Want says what the timing must be.
	Want string
}

func (e *TimingError) Error() string { return fmt.Sprintf("%s %s: want %s", e.Timing, e.Value, e.Want) }

// CheckTimings returns a *TimingError naming the first bad timing when the
// Lease timings cannot work, nil otherwise (zero values are the defaults):
// LeaseDuration a whole number of seconds, at least 1s (the Lease stores
// leaseDurationSeconds, an integer); LeaseDuration > RenewDeadline >
// RetryPeriod*1.2 (client-go's JitterFactor), each positive, as
// leaderelection.NewLeaderElector requires.
func (le LeaderElection) CheckTimings() error {
	lease, renew, retry := le.timings()
	switch {
	case lease < time.Second || lease%time.Second != 0:
		return &TimingError{"lease duration", lease, "a whole number of seconds, at least 1s (the Lease stores whole seconds)"}
	case renew <= 0 || renew >= lease:
		return &TimingError{"renew deadline", renew, fmt.Sprintf("more than 0 and less than the lease duration (%s)", lease)}
	case retry <= 0 || float64(renew) <= leaderelection.JitterFactor*float64(retry):
		return &TimingError{"retry period", retry, fmt.Sprintf("more than 0 and the renew deadline (%s) more than %g times it", renew, leaderelection.JitterFactor)}
	}
	return nil
}

// timings is le's LeaseDuration, RenewDeadline and RetryPeriod, the
// defaults for zeros (a negative one stays, for CheckTimings to refuse).
func (le LeaderElection) timings() (lease, renew, retry time.Duration) {
	d := func(v, def time.Duration) time.Duration {
		if v != 0 {
			return v
		}
		return def
	}
	return d(le.LeaseDuration, DefaultLeaseDuration), d(le.RenewDeadline, DefaultRenewDeadline), d(le.RetryPeriod, DefaultRetryPeriod)
}

// LeaseName is the name of the controller's Lease in each cluster.
const LeaseName = "fleetrepair-controller"

// runElection campaigns for cluster's Lease until ctx ends, reporting
// leadership changes to set. Losing a lease never stops the process: the
// replica keeps serving the API and campaigns again.
func runElection(ctx context.Context, le LeaderElection, cluster string, cs kubernetes.Interface, set func(string, bool)) error {
	lease, renew, retry := le.timings()
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: LeaseName, Namespace: le.Namespace},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: le.Identity},
	}
	cfg := leaderelection.LeaderElectionConfig{
		Lock: lock, Name: LeaseName + "/" + cluster, ReleaseOnCancel: true,
		LeaseDuration: lease, RenewDeadline: renew, RetryPeriod: retry,
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
