package source

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestGuard(t *testing.T) {
	t.Parallel()
	var g Guard
	boom := errors.New("boom")
	if err := g.Do(context.Background(), "op", time.Second, func() error { return boom }); !errors.Is(err, boom) {
		t.Errorf("error %v, want the call's", err)
	}
	release := make(chan struct{})
	if err := g.Do(context.Background(), "hang", 10*time.Millisecond, func() error { <-release; return nil }); !errors.Is(err, ErrTimeout) {
		t.Fatalf("error %v, want ErrTimeout", err)
	}
	called := false
	if err := g.Do(context.Background(), "next", time.Second, func() error { called = true; return nil }); !errors.Is(err, ErrBusy) || called {
		t.Errorf("while hung: error %v, called %v; want ErrBusy and no call", err, called)
	}
	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for g.Hung() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if err := g.Do(context.Background(), "after", time.Second, func() error { return nil }); err != nil {
		t.Errorf("after the hung call returned: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.Do(ctx, "cancelled", time.Second, func() error { time.Sleep(20 * time.Millisecond); return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled ctx: %v", err)
	}
}
