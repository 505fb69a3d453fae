package runner

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// TestElectionOneLeader: two replicas campaign for one cluster's Lease;
// exactly one leads, and when it stops the other takes over.
func TestElectionOneLeader(t *testing.T) {
	cs := fake.NewClientset()
	var mu sync.Mutex
	leading := map[string]bool{}
	set := func(id string) func(string, bool) {
		return func(_ string, l bool) { mu.Lock(); leading[id] = l; mu.Unlock() }
	}
	le := func(id string) LeaderElection {
		return LeaderElection{Namespace: "fr", Identity: id, LeaseDuration: 2 * time.Second, // whole seconds: the Lease stores leaseDurationSeconds
			RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond}
	}
	ctxA, stopA := context.WithCancel(context.Background())
	ctxB, stopB := context.WithCancel(context.Background())
	defer stopB()
	doneA := make(chan struct{})
	go func() { _ = runElection(ctxA, le("a"), "c1", cs, set("a")); close(doneA) }()
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return leading["a"] })
	go func() { _ = runElection(ctxB, le("b"), "c1", cs, set("b")) }()
	time.Sleep(2500 * time.Millisecond) // longer than a lease: A keeps renewing
	mu.Lock()
	if leading["b"] {
		t.Fatal("two leaders at once")
	}
	mu.Unlock()
	stopA()
	<-doneA
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return leading["b"] && !leading["a"] })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCheckTimings: the Lease timings NewLeaderElector would refuse, or
// that the Lease cannot store, are refused naming the value; the defaults
// (zeros) and a short failover pass, and every accepted set is one
// leaderelection.NewLeaderElector takes.
func TestCheckTimings(t *testing.T) {
	t.Parallel()
	s := time.Second
	for _, tc := range []struct {
		lease, renew, retry time.Duration
		wantErr             string
	}{
		{0, 0, 0, ""},
		{5 * s, 3 * s, s, ""},
		{2 * s, 1500 * time.Millisecond, 200 * time.Millisecond, ""},
		{1500 * time.Millisecond, s, 200 * time.Millisecond, "lease duration 1.5s: want a whole number of seconds"},
		{500 * time.Millisecond, 0, 0, "lease duration 500ms"},
		{5 * s, 5 * s, s, "renew deadline 5s: want more than 0 and less than the lease duration (5s)"},
		{0, 20 * s, 0, "renew deadline 20s"},
		{5 * s, 3 * s, 2500 * time.Millisecond, "retry period 2.5s"},
		{5 * s, 3 * s, -s, "retry period -1s"},
	} {
		le := LeaderElection{Namespace: "fr", Identity: "a", LeaseDuration: tc.lease, RenewDeadline: tc.renew, RetryPeriod: tc.retry}
		err := le.CheckTimings()
		if tc.wantErr == "" {
			if err != nil {
				t.Errorf("CheckTimings(%s, %s, %s) = %v, want nil", tc.lease, tc.renew, tc.retry, err)
				continue
			}
			lease, renew, retry := le.timings()
			if _, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
				Lock: &resourcelock.LeaseLock{LockConfig: resourcelock.ResourceLockConfig{Identity: "a"}}, Name: "x",
				LeaseDuration: lease, RenewDeadline: renew, RetryPeriod: retry,
				Callbacks: leaderelection.LeaderCallbacks{OnStartedLeading: func(context.Context) {}, OnStoppedLeading: func() {}},
			}); err != nil {
				t.Errorf("CheckTimings accepted %s, %s, %s; NewLeaderElector refuses it: %v", lease, renew, retry, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("CheckTimings(%s, %s, %s) = %v, want an error with %q", tc.lease, tc.renew, tc.retry, err, tc.wantErr)
		}
	}
}
