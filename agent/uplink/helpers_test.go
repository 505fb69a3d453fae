package uplink

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
	fakeclock "k8s.io/utils/clock/testing"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// guard bounds how long a test waits for something that should happen; it
// only turns a hang into a failure and is never a timing assertion.
const guard = 10 * time.Second

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// received is one POST as the test controller saw it.
type received struct {
	n      int // 1-based request number
	report finding.Report
	raw    string
	header http.Header
}

func (r received) ids() []string {
	ids := make([]string, len(r.report.Findings))
	for i, f := range r.report.Findings {
		ids[i] = f.ID
	}
	return ids
}

// respondFunc decides the answer to request n: an HTTP status and body. A
// negative status closes the connection without an answer.
type respondFunc func(n int, rep finding.Report, r *http.Request) (int, string)

// collector is a test controller: it records every report and answers as
// respond says (200 by default).
type collector struct {
	srv     *httptest.Server
	n       atomic.Int64
	ch      chan received
	respond respondFunc
}

func newCollector(t *testing.T, respond respondFunc) *collector {
	t.Helper()
	c := &collector{ch: make(chan received, 10000), respond: respond}
	c.srv = httptest.NewServer(http.HandlerFunc(c.serve))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *collector) serve(w http.ResponseWriter, r *http.Request) {
	n := int(c.n.Add(1))
	raw, _ := io.ReadAll(r.Body)
	var rep finding.Report
	if r.URL.Path != ReportsPath || r.Method != http.MethodPost {
		http.Error(w, "wrong endpoint "+r.Method+" "+r.URL.Path, http.StatusNotFound)
		return
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.ch <- received{n: n, report: rep, raw: string(raw), header: r.Header.Clone()}
	status, body := http.StatusOK, `{"accepted":true}`
	if c.respond != nil {
		status, body = c.respond(n, rep, r)
	}
	if status < 0 {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "7")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	io.WriteString(w, body)
}

// next returns the next report the controller received.
func (c *collector) next(t *testing.T) received {
	t.Helper()
	select {
	case r := <-c.ch:
		return r
	case <-time.After(guard):
		t.Fatalf("no report reached the controller within %v", guard)
		return received{}
	}
}

// none fails if a report is waiting. Call it when the sender is idle.
func (c *collector) none(t *testing.T) {
	t.Helper()
	select {
	case r := <-c.ch:
		t.Fatalf("unexpected report #%d with %d findings", r.n, len(r.report.Findings))
	default:
	}
}

// recordingClock is a fake clock that remembers the duration of the last
// timer created, so tests can check the computed backoff waits.
type recordingClock struct {
	*fakeclock.FakeClock
	mu   sync.Mutex
	last time.Duration
}

func (c *recordingClock) NewTimer(d time.Duration) clock.Timer {
	c.mu.Lock()
	c.last = d
	c.mu.Unlock()
	return c.FakeClock.NewTimer(d)
}

func (c *recordingClock) lastTimer() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// waitIdle waits until the sender sleeps on a timer: idle, or waiting to
// retry. Everything it had to send before that has reached the collector.
// Do not rely on it right after Enqueue: the sender may not have woken yet.
func (c *recordingClock) waitIdle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(guard)
	for !c.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatalf("sender did not go idle within %v", guard)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type harness struct {
	u    *Uplink
	clk  *recordingClock
	reg  *prometheus.Registry
	logs *syncBuffer
	col  *collector
}

// newHarness builds an Uplink on a fake clock (starting at t0, never moving
// unless the test steps it) against a test controller.
func newHarness(t *testing.T, respond respondFunc, mutate func(*Config)) *harness {
	t.Helper()
	h := &harness{
		clk:  &recordingClock{FakeClock: fakeclock.NewFakeClock(t0)},
		reg:  prometheus.NewRegistry(),
		logs: &syncBuffer{},
		col:  newCollector(t, respond),
	}
	cfg := Config{
		URL:          h.col.srv.URL,
		Cluster:      "c1",
		Node:         "node-a1",
		BootID:       "boot-1",
		AgentVersion: "v0.0.0-test",
		Token:        "secret",
		Logger:       slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registerer:   h.reg,
		Clock:        h.clk,
		Rand:         func() float64 { return 0 },
	}
	if mutate != nil {
		mutate(&cfg)
	}
	u, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.u = u
	return h
}

// run starts Run; the returned stop cancels it and returns Run's error.
func (h *harness) run(t *testing.T) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.u.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(guard):
				t.Errorf("Run did not return within %v of cancel", guard)
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

// metric returns the value of the counter or gauge name{labels...} (pairs).
func (h *harness) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return 0
}

// sumMetric adds every series of the counter name.
func (h *harness) sumMetric(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

const mp = "fleetrepair_agent_uplink_"

// xid returns a finding for Xid x; 79 is critical by default, 13 is not.
func xid(id string, x int) finding.Finding {
	return finding.Finding{
		ID: id, Detector: finding.DetectorXid, Node: "node-a1", BootID: "boot-1",
		Time: t0, GPUPCI: "0000:3b:00.0", Xid: x, Count: 1,
		Evidence: []string{"NVRM: Xid (PCI:0000:3b:00): " + strconv.Itoa(x) + ", test " + id},
	}
}

func crit(id string) finding.Finding { return xid(id, 79) }
func norm(id string) finding.Finding { return xid(id, 13) }

func idList(n int, prefix string) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = prefix + strconv.Itoa(i)
	}
	return ids
}

func count(s, sub string) int { return strings.Count(s, sub) }
