package kube

import (
	"context"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// TestNewCachedWithServerDown: building a cached cluster whose API server
// does not answer succeeds (no discovery call), and its probe says the
// server is unreachable. Before restMapper, the informers' discovery failed
// NewCached, and with it the start of a controller serving other clusters.
func TestNewCachedWithServerDown(t *testing.T) {
	k, err := NewCached("down", &rest.Config{Host: "https://127.0.0.1:1"}, CachedOptions{RequestTimeout: time.Second})
	if err != nil {
		t.Fatalf("NewCached with the API server down: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := k.Probe(ctx); err == nil {
		t.Fatal("Probe of a server that does not answer succeeded")
	}
}
