package runner

import (
	"context"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
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
