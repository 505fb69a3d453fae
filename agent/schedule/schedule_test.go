package schedule

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// wake is one run of a job, at the fake clock's time.
type wake struct {
	job string
	at  time.Time
}

// drive runs s on the fake clock for d in steps of step, waiting after each
// step until the scheduler is blocked again and every started job finished.
func drive(t *testing.T, s *Scheduler, clk *clocktesting.FakeClock, d, step time.Duration, finished *atomic.Int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	settle := func() {
		for i := 0; ; i++ {
			var started uint64
			for _, n := range s.Stats().Runs {
				started += n
			}
			if clk.HasWaiters() && uint64(finished.Load()) == started {
				return
			}
			if i > 1e7 {
				t.Fatal("scheduler did not settle")
			}
			runtime.Gosched()
		}
	}
	settle()
	for el := time.Duration(0); el < d; el += step {
		clk.Step(step)
		settle()
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func jobs(n int, every time.Duration, clk *clocktesting.FakeClock, mu *sync.Mutex, wakes *[]wake, finished *atomic.Int64) []Job {
	var out []Job
	for i := range n {
		name := fmt.Sprintf("monitor-%d", i)
		out = append(out, Job{Name: name, Every: every, Run: func(context.Context) {
			mu.Lock()
			*wakes = append(*wakes, wake{name, clk.Now()})
			mu.Unlock()
			finished.Add(1)
		}})
	}
	return out
}

// TestSpacing runs six monitors with the same period and checks that every
// period runs each once, and that no two wake-ups are closer than MinSpacing.
func TestSpacing(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(t0)
	var mu sync.Mutex
	var wakes []wake
	var finished atomic.Int64
	s, err := New(Options{Node: "node-a1", Clock: clk, MinSpacing: 25 * time.Millisecond},
		jobs(6, 10*time.Second, clk, &mu, &wakes, &finished)...)
	if err != nil {
		t.Fatal(err)
	}
	drive(t, s, clk, 60*time.Second, 5*time.Millisecond, &finished)
	sort.Slice(wakes, func(a, b int) bool { return wakes[a].at.Before(wakes[b].at) })
	per := map[string]int{}
	for i, w := range wakes {
		per[w.job]++
		if i > 0 {
			if gap := w.at.Sub(wakes[i-1].at); gap < 25*time.Millisecond {
				t.Errorf("%s at %s only %s after %s", w.job, w.at.Format("15:04:05.000"), gap, wakes[i-1].job)
			}
		}
	}
	for name, n := range per {
		if n < 5 || n > 7 {
			t.Errorf("%s ran %d times in 60s with a 10s period", name, n)
		}
	}
	if len(per) != 6 {
		t.Errorf("%d jobs ran, want 6", len(per))
	}
}

// TestPhaseDeterministic checks that phases depend on the node name only:
// the same node gets the same phases, other nodes other phases.
func TestPhaseDeterministic(t *testing.T) {
	t.Parallel()
	job := Job{Name: "nvml", Every: time.Minute, Run: func(context.Context) {}}
	phase := func(node string) time.Duration {
		s, err := New(Options{Node: node}, job)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := s.Phase("nvml")
		return p
	}
	if phase("node-a1") != phase("node-a1") {
		t.Error("phase differs for the same node")
	}
	distinct := map[time.Duration]bool{}
	for i := range 50 {
		p := phase(fmt.Sprintf("node-%d", i))
		if p < 0 || p >= time.Minute {
			t.Errorf("phase %s out of the period", p)
		}
		distinct[p/time.Second] = true
	}
	if len(distinct) < 25 {
		t.Errorf("50 nodes share only %d distinct phase seconds: nodes would wake together", len(distinct))
	}
}

// TestBoundedConcurrency checks MaxConcurrent and that a job still running
// at its next period is skipped, not stacked.
func TestBoundedConcurrency(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(t0)
	release := make(chan struct{})
	var running, peak atomic.Int64
	block := func(context.Context) {
		n := running.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-release
		running.Add(-1)
	}
	s, err := New(Options{Node: "n", Clock: clk, MaxConcurrent: 2},
		Job{Name: "a", Every: time.Second, Run: block}, Job{Name: "b", Every: time.Second, Run: block},
		Job{Name: "c", Every: time.Second, Run: block})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	for range 400 { // 4 s in 10 ms steps
		clk.Step(10 * time.Millisecond)
		for range 50 {
			runtime.Gosched()
		}
	}
	st := s.Stats()
	if peak.Load() > 2 {
		t.Errorf("%d jobs ran at once, MaxConcurrent is 2", peak.Load())
	}
	var skipped uint64
	for _, n := range st.Skipped {
		skipped += n
	}
	if skipped == 0 {
		t.Errorf("no period was skipped while jobs hung: %+v", st)
	}
	cancel()
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestNewRejectsBadJobs(t *testing.T) {
	t.Parallel()
	run := func(context.Context) {}
	tests := []struct {
		name string
		jobs []Job
	}{
		{"empty name", []Job{{Every: time.Second, Run: run}}},
		{"duplicate", []Job{{Name: "a", Every: time.Second, Run: run}, {Name: "a", Every: time.Second, Run: run}}},
		{"zero period", []Job{{Name: "a", Run: run}}},
		{"nil run", []Job{{Name: "a", Every: time.Second}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if _, err := New(Options{}, tt.jobs...); err == nil {
				t.Error("New accepted bad jobs")
			}
		})
	}
	s, _ := New(Options{})
	if err := s.Run(context.Background()); err == nil {
		t.Error("Run without jobs returned nil")
	}
}

// BenchmarkNextAfter is the cost of planning one wake-up.
func BenchmarkNextAfter(b *testing.B) {
	j := &job{Job: Job{Name: "nvml", Every: time.Minute, Jitter: 5 * time.Second}, phase: 17 * time.Second}
	at := t0
	for b.Loop() {
		at = j.nextAfter("node-a1", at)
	}
}
