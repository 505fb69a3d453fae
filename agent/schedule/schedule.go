// Package schedule runs all of the agent's periodic work from one loop, so
// that the agent never wakes in bursts that could steal CPU from a training
// job (every rank of an NCCL job waits for the slowest node):
//
//   - each job's phase within its period is a hash of the node name and the
//     job name, aligned to the wall clock, so the nodes of a cluster do not
//     wake together and a node's monitors do not either;
//   - a deterministic jitter (also hashed, per period) keeps phases of jobs
//     with different periods from locking together;
//   - two wake-ups of one node are at least MinSpacing apart: one job runs
//     per wake-up, never a batch;
//   - at most MaxConcurrent jobs run at once; a job whose period comes while
//     it is still running, or while MaxConcurrent jobs run, is skipped for
//     that period (counted in Stats), never queued: a hung driver call cannot
//     make work pile up.
//
// Pushed sources (the kernel log, DCGM policy violations) are not jobs here:
// they are not polled.
package schedule

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// Defaults of Options.
const (
	DefaultMinSpacing    = 25 * time.Millisecond
	DefaultMaxConcurrent = 1
	// MaxJitter caps the default jitter (a tenth of the period).
	MaxJitter = 5 * time.Second
)

// Job is one periodic task.
type Job struct {
	// Name identifies the job; it feeds the phase hash, so keep it stable.
	Name string
	// Every is the period (> 0).
	Every time.Duration
	// Jitter is the width of the per-period random delay; 0 means
	// min(Every/10, MaxJitter), negative means none.
	Jitter time.Duration
	// Run does the work. It gets a context that ends with the scheduler's.
	Run func(ctx context.Context)
}

// Options configure a Scheduler.
type Options struct {
	// Node is the node name, the seed of every phase.
	Node string
	// Clock is the time source; default the real clock. Tests pass a fake.
	Clock clock.WithTicker
	// MinSpacing is the least time between two wake-ups; default DefaultMinSpacing.
	MinSpacing time.Duration
	// MaxConcurrent bounds jobs running at once; default DefaultMaxConcurrent.
	MaxConcurrent int
}

// Stats are a Scheduler's counters.
type Stats struct {
	Runs    map[string]uint64 // runs started, by job
	Skipped map[string]uint64 // periods skipped: the job was still running, or MaxConcurrent were
}

// Scheduler runs Jobs. Build it with New, then call Run once.
type Scheduler struct {
	opts  Options
	jobs  []*job
	mu    sync.Mutex
	stats Stats
}

type job struct {
	Job
	phase   time.Duration
	next    time.Time
	running atomic.Bool
}

// New validates the jobs and returns a Scheduler.
func New(opts Options, jobs ...Job) (*Scheduler, error) {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.MinSpacing <= 0 {
		opts.MinSpacing = DefaultMinSpacing
	}
	if opts.MaxConcurrent <= 0 {
		opts.MaxConcurrent = DefaultMaxConcurrent
	}
	s := &Scheduler{opts: opts, stats: Stats{Runs: map[string]uint64{}, Skipped: map[string]uint64{}}}
	seen := map[string]bool{}
	for _, j := range jobs {
		switch {
		case j.Name == "" || seen[j.Name]:
			return nil, fmt.Errorf("new scheduler: job name %q empty or used twice", j.Name)
		case j.Every <= 0:
			return nil, fmt.Errorf("new scheduler: job %q: period must be positive, got %s", j.Name, j.Every)
		case j.Run == nil:
			return nil, fmt.Errorf("new scheduler: job %q: Run is nil", j.Name)
		}
		seen[j.Name] = true
		if j.Jitter == 0 {
			j.Jitter = min(j.Every/10, MaxJitter)
		}
		if j.Jitter < 0 {
			j.Jitter = 0
		}
		s.jobs = append(s.jobs, &job{Job: j, phase: time.Duration(hash(opts.Node, j.Name, 0) % uint64(j.Every))})
	}
	return s, nil
}

func hash(node, job string, period int64) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%s\x00%d", node, job, period)
	return h.Sum64()
}

// Phase returns the job's phase within its period (wall-clock aligned).
func (s *Scheduler) Phase(name string) (time.Duration, bool) {
	for _, j := range s.jobs {
		if j.Name == name {
			return j.phase, true
		}
	}
	return 0, false
}

// Stats returns a copy of the counters.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := Stats{Runs: map[string]uint64{}, Skipped: map[string]uint64{}}
	for k, v := range s.stats.Runs {
		out.Runs[k] = v
	}
	for k, v := range s.stats.Skipped {
		out.Skipped[k] = v
	}
	return out
}

// nextAfter is the job's first wake-up strictly after t: the next period
// boundary (Unix-epoch aligned, shifted by the phase) plus that period's
// jitter.
func (j *job) nextAfter(node string, t time.Time) time.Time {
	n := t.UnixNano() - int64(j.phase)
	k := n/int64(j.Every) + 1
	if n < 0 {
		k = 0
	}
	for {
		at := time.Unix(0, k*int64(j.Every)+int64(j.phase))
		if j.Jitter > 0 {
			at = at.Add(time.Duration(hash(node, j.Name, k) % uint64(j.Jitter)))
		}
		if at.After(t) {
			return at
		}
		k++
	}
}

// ErrNoJobs is returned by Run when there is nothing to schedule.
var ErrNoJobs = errors.New("no jobs")

// Run runs the jobs until ctx ends, then waits for running jobs to return.
// It returns nil when ctx ends.
func (s *Scheduler) Run(ctx context.Context) error {
	if len(s.jobs) == 0 {
		return fmt.Errorf("run scheduler: %w", ErrNoJobs)
	}
	clk := s.opts.Clock
	now := clk.Now()
	for _, j := range s.jobs {
		j.next = j.nextAfter(s.opts.Node, now)
	}
	sem := make(chan struct{}, s.opts.MaxConcurrent)
	var wg sync.WaitGroup
	defer wg.Wait()
	var last time.Time
	for {
		sort.SliceStable(s.jobs, func(a, b int) bool { return s.jobs[a].next.Before(s.jobs[b].next) })
		j := s.jobs[0]
		at := j.next
		if !last.IsZero() && at.Before(last.Add(s.opts.MinSpacing)) {
			at = last.Add(s.opts.MinSpacing) // keep wake-ups apart
		}
		if d := at.Sub(clk.Now()); d > 0 {
			t := clk.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C():
			}
		} else if ctx.Err() != nil {
			return nil
		}
		last = clk.Now()
		j.next = j.nextAfter(s.opts.Node, maxTime(j.next, last))
		if !j.running.CompareAndSwap(false, true) {
			s.count(s.stats.Skipped, j.Name)
			continue
		}
		select {
		case sem <- struct{}{}:
		default: // MaxConcurrent jobs are running: skip this period rather than queue
			j.running.Store(false)
			s.count(s.stats.Skipped, j.Name)
			continue
		}
		s.count(s.stats.Runs, j.Name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem; j.running.Store(false) }()
			j.Run(ctx)
		}()
	}
}

func (s *Scheduler) count(m map[string]uint64, name string) {
	s.mu.Lock()
	m[name]++
	s.mu.Unlock()
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
