package uplink

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	valid := func() Config {
		return Config{URL: "https://ctl.example:8443/", Cluster: "c1", Node: "n1", BootID: "b1"}
	}
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string // "" means valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"missing url", func(c *Config) { c.URL = "" }, "url: required"},
		{"relative url", func(c *Config) { c.URL = "/api" }, "not an absolute http(s) URL"},
		{"ftp url", func(c *Config) { c.URL = "ftp://x" }, "not an absolute http(s) URL"},
		{"url with query", func(c *Config) { c.URL = "http://x/?a=b" }, "without query"},
		{"missing cluster", func(c *Config) { c.Cluster = "" }, "cluster: required"},
		{"missing node", func(c *Config) { c.Node = "" }, "node: required"},
		{"missing boot id", func(c *Config) { c.BootID = "" }, "bootID: required"},
		{"token and file", func(c *Config) { c.Token, c.TokenFile = "a", "/b" }, "set at most one"},
		{"batch too big", func(c *Config) { c.BatchSize = finding.MaxFindingsPerReport + 1 }, "batchSize: 1001 is not in 1..1000"},
		{"batch negative", func(c *Config) { c.BatchSize = -1 }, "batchSize"},
		{"batch max", func(c *Config) { c.BatchSize = finding.MaxFindingsPerReport }, ""},
		{"queue negative", func(c *Config) { c.QueueSize = -5 }, "queueSize: -5 must be >= 1"},
		{"negative flush", func(c *Config) { c.FlushInterval = -time.Second }, "flushInterval: -1s must be positive"},
		{"heartbeat below flush", func(c *Config) { c.FlushInterval, c.HeartbeatInterval = time.Minute, time.Second },
			"heartbeatInterval: 1s is shorter than flushInterval 1m0s"},
		{"retry max below initial", func(c *Config) { c.RetryInitialInterval, c.RetryMaxInterval = time.Minute, time.Second },
			"retryMaxInterval"},
		{"two problems listed", func(c *Config) { c.Cluster, c.Node = "", "" }, "cluster: required\nnode: required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := valid()
			tt.mutate(&cfg)
			u, err := New(cfg)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("New error = %v, want it to contain %q", err, tt.wantErr)
			}
			if u != nil {
				t.Fatalf("New returned an Uplink with an error")
			}
		})
	}

	t.Run("defaults applied", func(t *testing.T) {
		t.Parallel()
		u, err := New(valid())
		if err != nil {
			t.Fatal(err)
		}
		c := u.cfg
		if c.BatchSize != 100 || c.QueueSize != 10000 || c.FlushInterval != 5*time.Second ||
			c.HeartbeatInterval != 30*time.Second || c.RetryMaxInterval != 30*time.Second {
			t.Fatalf("defaults not applied: %+v", c)
		}
		if u.endpoint != "https://ctl.example:8443/api/v1/reports" {
			t.Fatalf("endpoint = %q", u.endpoint)
		}
	})

	t.Run("metrics registered once per registry", func(t *testing.T) {
		t.Parallel()
		reg := prometheus.NewRegistry()
		cfg := valid()
		cfg.Registerer = reg
		if _, err := New(cfg); err != nil {
			t.Fatal(err)
		}
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "register uplink metrics") {
			t.Fatalf("second New on the same registry: err = %v", err)
		}
	})
}

func TestDefaultCritical(t *testing.T) {
	t.Parallel()
	x := func(n int, attrs ...string) finding.Finding {
		f := finding.Finding{Detector: finding.DetectorXid, Xid: n, Attrs: map[string]string{}}
		for i := 0; i+1 < len(attrs); i += 2 {
			f.Attrs[attrs[i]] = attrs[i+1]
		}
		return f
	}
	d := func(det string) finding.Finding { return finding.Finding{Detector: det} }
	tests := []struct {
		name string
		f    finding.Finding
		want bool
	}{
		{"xid 79 fallen off the bus", x(79), true},
		{"xid 48 DBE", x(48), true},
		{"xid 95 uncontained", x(95), true},
		{"xid 119 GSP timeout", x(119), true},
		{"xid 13 app error", x(13), false},
		{"xid 31 mmu fault", x(31), false},
		{"xid 94 contained", x(94), false},
		{"xid 45 secondary", x(45, finding.AttrSecondary, "true"), false},
		{"xid 79 marked secondary", x(79, finding.AttrSecondary, "true"), false},
		{"xid 154 reset required", x(154, finding.AttrRecoveryAction, "gpu-reset-required"), true},
		{"xid 154 none", x(154, finding.AttrRecoveryAction, "none"), false},
		{"xid 154 unknown action", x(154), false},
		{"fallen-off-bus", d(finding.DetectorFallenOffBus), true},
		{"aer-fatal", d(finding.DetectorAERFatal), true},
		{"gpu-count", d(finding.DetectorGPUCount), true},
		{"rminit-failed", d(finding.DetectorRmInitFailed), true},
		{"aer-correctable", d(finding.DetectorAERCorrectable), false},
		{"driver-version", d(finding.DetectorDriverVersion), false},
		{"monitoring-plane", d(finding.DetectorMonitoring), false},
	}
	for _, tt := range tests {
		if got := DefaultCritical(tt.f); got != tt.want {
			t.Errorf("%s: DefaultCritical = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestBatching(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		batchSize  int
		n          int
		wantAtOnce []int // report sizes sent before the flush point
		wantFlush  []int // report sizes sent at the flush point
	}{
		{"full batches at once, remainder at flush", 3, 7, []int{3, 3}, []int{1}},
		{"exact multiple", 2, 4, []int{2, 2}, nil},
		{"below one batch waits for flush", 100, 5, nil, []int{5}},
		{"max batch", finding.MaxFindingsPerReport, 2500, []int{1000, 1000}, []int{500}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, nil, func(c *Config) {
				c.BatchSize = tt.batchSize
				c.FlushInterval = time.Minute
				c.HeartbeatInterval = time.Hour
			})
			want := idList(tt.n, "f")
			for _, id := range want {
				h.u.Enqueue(norm(id))
			}
			h.run(t)

			var got []string
			check := func(phase string, sizes []int) {
				t.Helper()
				for _, size := range sizes {
					r := h.col.next(t)
					if len(r.report.Findings) != size {
						t.Fatalf("%s: report #%d has %d findings, want %d", phase, r.n, len(r.report.Findings), size)
					}
					got = append(got, r.ids()...)
					checkEnvelope(t, h, r)
				}
				h.clk.waitIdle(t)
				h.col.none(t)
			}
			check("at once", tt.wantAtOnce)
			h.clk.Step(time.Minute) // the first flush point is at most one FlushInterval away
			check("at flush", tt.wantFlush)

			if !slices.Equal(got, want) {
				t.Fatalf("delivered %d findings out of order or not exactly once", len(got))
			}
			if v := h.metric(t, mp+"sent_findings_total"); v != float64(tt.n) {
				t.Errorf("sent_findings_total = %v, want %d", v, tt.n)
			}
			if v := h.metric(t, mp+"queue_length"); v != 0 {
				t.Errorf("queue_length = %v, want 0", v)
			}
		})
	}
}

func checkEnvelope(t *testing.T, h *harness, r received) {
	t.Helper()
	rep := r.report
	if rep.SchemaVersion != finding.SchemaVersion || rep.Cluster != "c1" || rep.Node != "node-a1" ||
		rep.BootID != "boot-1" || rep.AgentVersion != "v0.0.0-test" {
		t.Errorf("envelope = %+v", rep)
	}
	if rep.SentAt.IsZero() || rep.SentAt.Before(t0) || rep.SentAt.After(h.clk.Now()) {
		t.Errorf("sentAt = %v, want a fake-clock time in [%v, %v]", rep.SentAt, t0, h.clk.Now())
	}
	if err := rep.Validate(); err != nil {
		t.Errorf("sent report does not validate: %v", err)
	}
	if got := r.header.Get("Authorization"); got != "Bearer secret" {
		t.Errorf("Authorization = %q", got)
	}
	if got := r.header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type = %q", got)
	}
}

func TestCriticalFlushesAtOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		critical func(finding.Finding) bool // nil: DefaultCritical
		f        finding.Finding
	}{
		{"xid 79", nil, crit("c")},
		{"aer-fatal", nil, finding.Finding{ID: "c", Detector: finding.DetectorAERFatal, Count: 1}},
		{"custom critical func", func(f finding.Finding) bool { return f.Detector == "custom" },
			finding.Finding{ID: "c", Detector: "custom", Count: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, nil, func(c *Config) {
				c.FlushInterval = 24 * time.Hour // a non-critical finding would wait a day
				c.HeartbeatInterval = 24 * time.Hour
				c.Critical = tt.critical
			})
			h.u.Enqueue(norm("n"))
			h.run(t)
			h.clk.waitIdle(t)
			h.col.none(t) // the non-critical one waits

			h.u.Enqueue(tt.f)
			r := h.col.next(t)
			if got := r.ids(); !slices.Equal(got, []string{"n", "c"}) {
				t.Fatalf("report ids = %v, want the waiting finding and the critical one, in enqueue order", got)
			}
			if !h.clk.Now().Equal(t0) {
				t.Fatalf("the clock moved to %v: the critical finding must not wait for time to pass", h.clk.Now())
			}
		})
	}
}

func TestCriticalFirstWhenBacklogged(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil, func(c *Config) {
		c.BatchSize = 3
		c.FlushInterval = time.Hour
		c.HeartbeatInterval = time.Hour
	})
	for _, id := range []string{"n1", "n2", "n3", "n4"} {
		h.u.Enqueue(norm(id))
	}
	h.u.Enqueue(crit("c1"))
	h.run(t)
	// The critical finding goes in the first report even though four older
	// findings wait; the rest fills it in enqueue order.
	if got := h.col.next(t).ids(); !slices.Equal(got, []string{"n1", "n2", "c1"}) {
		t.Fatalf("first report = %v", got)
	}
}

func TestRetryUntilAccepted(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		status    int // answer to the first 3 attempts; -1 closes the connection
		reason    string
		wantWaits []time.Duration // backoff waits with Rand = 0: half the exponential schedule
	}{
		{"503", http.StatusServiceUnavailable, err5xx, []time.Duration{7 * time.Second, 7 * time.Second, 7 * time.Second}}, // Retry-After: 7
		{"500", http.StatusInternalServerError, err5xx, []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}},
		{"502", http.StatusBadGateway, err5xx, []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}},
		{"429", http.StatusTooManyRequests, err429, []time.Duration{7 * time.Second, 7 * time.Second, 7 * time.Second}},
		{"408", http.StatusRequestTimeout, err408, []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}},
		{"401 token not yet valid", http.StatusUnauthorized, errAuth, []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}},
		{"connection closed", -1, errNetwork, []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}},
	}
	const failures = 3
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(n int, _ finding.Report, _ *http.Request) (int, string) {
				if n <= failures {
					return tt.status, `{"message":"not now"}`
				}
				return http.StatusOK, `{}`
			}, func(c *Config) {
				c.FlushInterval = time.Hour
				c.HeartbeatInterval = time.Hour
				c.RetryInitialInterval = time.Second
				c.RetryMaxInterval = 30 * time.Second
			})
			h.u.Enqueue(crit("c1"))
			h.u.Enqueue(norm("n1"))
			h.run(t)

			want := h.col.next(t).ids()
			if !slices.Equal(want, []string{"c1", "n1"}) {
				t.Fatalf("first attempt carried %v", want)
			}
			var waits []time.Duration
			for i := 0; i < failures; i++ {
				h.clk.waitIdle(t) // the sender waits to retry
				waits = append(waits, h.clk.lastTimer())
				h.clk.Step(30 * time.Second)
				if got := h.col.next(t).ids(); !slices.Equal(got, want) {
					t.Fatalf("attempt %d carried %v, want the same batch %v", i+2, got, want)
				}
			}
			h.clk.waitIdle(t)
			h.col.none(t)

			if !slices.Equal(waits, tt.wantWaits) {
				t.Errorf("backoff waits = %v, want %v", waits, tt.wantWaits)
			}
			for name, want := range map[string]float64{
				"retries_total": failures, "sent_reports_total": 1, "sent_findings_total": 2,
				"rejected_total": 0, "queue_length": 0,
			} {
				if got := h.metric(t, mp+name); got != want {
					t.Errorf("%s = %v, want %v", name, got, want)
				}
			}
			if got := h.metric(t, mp+"send_errors_total", "reason", tt.reason); got != failures {
				t.Errorf("send_errors_total{reason=%q} = %v, want %d", tt.reason, got, failures)
			}
			if got := h.sumMetric(t, mp+"dropped_total"); got != 0 {
				t.Errorf("dropped_total = %v, want 0", got)
			}
			if h.metric(t, mp+"last_success_timestamp_seconds") == 0 {
				t.Error("last_success_timestamp_seconds not set")
			}
			logs := h.logs.String()
			if c := count(logs, "retrying with backoff"); c != 1 {
				t.Errorf("outage logged at warn %d times, want once:\n%s", c, logs)
			}
			if c := count(logs, "controller reachable again"); c != 1 {
				t.Errorf("recovery logged %d times, want once", c)
			}
		})
	}
}

func TestRetryWait(t *testing.T) {
	t.Parallel()
	u, err := New(Config{URL: "http://x", Cluster: "c", Node: "n", BootID: "b", RetryMaxInterval: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		d          time.Duration
		retryAfter time.Duration
		rand       float64
		want       time.Duration
	}{
		{"low jitter is half", 4 * time.Second, 0, 0, 2 * time.Second},
		{"high jitter just below d", 4 * time.Second, 0, 0.999, 3998 * time.Millisecond},
		{"schedule capped", time.Minute, 0, 0.999, 29985 * time.Millisecond},
		{"retry-after wins", 2 * time.Second, 10 * time.Second, 0, 10 * time.Second},
		{"retry-after capped", 2 * time.Second, time.Hour, 0, 30 * time.Second},
		{"retry-after spread over a quarter of it", 2 * time.Second, 10 * time.Second, 0.999, 12497500 * time.Microsecond},
		{"spread retry-after capped", 2 * time.Second, 28 * time.Second, 0.999, 30 * time.Second},
		{"short retry-after ignored", 8 * time.Second, time.Second, 0, 4 * time.Second},
	}
	for _, tt := range tests {
		u.cfg.Rand = func() float64 { return tt.rand }
		if got := u.retryWait(tt.d, tt.retryAfter); got != tt.want {
			t.Errorf("%s: retryWait(%v, %v) = %v, want %v", tt.name, tt.d, tt.retryAfter, got, tt.want)
		}
	}
}

func TestRejectedBatchIsDroppedOnce(t *testing.T) {
	t.Parallel()
	const msg = "schemaVersion: \\\"fleetrepair.dev/v0\\\" is not supported"
	for _, status := range []int{http.StatusBadRequest, http.StatusNotFound, http.StatusUnprocessableEntity} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(n int, _ finding.Report, _ *http.Request) (int, string) {
				if n == 1 {
					return status, `{"message":"invalid report","detail":"` + msg + `","validations":[{"field":"schemaVersion"}]}`
				}
				return http.StatusOK, `{}`
			}, func(c *Config) {
				c.FlushInterval = time.Hour
				c.HeartbeatInterval = time.Hour
			})
			h.u.Enqueue(norm("bad1"))
			h.u.Enqueue(crit("bad2"))
			h.run(t)
			if got := h.col.next(t).ids(); !slices.Equal(got, []string{"bad1", "bad2"}) {
				t.Fatalf("first report = %v", got)
			}
			h.clk.waitIdle(t)
			h.col.none(t) // not retried

			h.u.Enqueue(crit("good"))
			r := h.col.next(t)
			if got := r.ids(); !slices.Equal(got, []string{"good"}) {
				t.Fatalf("after the rejection the controller got %v, want only the new finding", got)
			}
			h.clk.waitIdle(t)
			for name, want := range map[string]float64{"rejected_total": 1, "retries_total": 0, "sent_findings_total": 1} {
				if got := h.metric(t, mp+name); got != want {
					t.Errorf("%s = %v, want %v", name, got, want)
				}
			}
			if got := h.metric(t, mp+"dropped_total", "reason", DropRejected); got != 2 {
				t.Errorf("dropped_total{rejected} = %v, want 2", got)
			}
			if got := h.sumMetric(t, mp+"send_errors_total"); got != 0 {
				t.Errorf("send_errors_total = %v, want 0 (a rejection is not retried)", got)
			}
			logs := h.logs.String()
			if c := count(logs, "controller rejected report"); c != 1 {
				t.Fatalf("rejection logged %d times, want once:\n%s", c, logs)
			}
			if !strings.Contains(logs, "is not supported") || !strings.Contains(logs, "schemaVersion") {
				t.Fatalf("the controller's message is not in the log:\n%s", logs)
			}
		})
	}
}

func TestInvalidFindingDroppedBeforeSending(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil, func(c *Config) { c.FlushInterval, c.HeartbeatInterval = time.Hour, time.Hour })
	bad := crit("bad")
	bad.Count = 0
	noID := crit("")
	h.u.Enqueue(bad)
	h.u.Enqueue(noID)
	h.run(t)
	r := h.col.next(t)
	if got := r.ids(); !slices.Equal(got, []string{finding.NewID(noID)}) {
		t.Fatalf("report ids = %v, want only the valid finding, with its NewID", got)
	}
	if got := h.metric(t, mp+"dropped_total", "reason", DropInvalid); got != 1 {
		t.Fatalf("dropped_total{invalid} = %v, want 1", got)
	}
	if !strings.Contains(h.logs.String(), "findings[0].count: must be >= 1") {
		t.Fatalf("validation problem not logged:\n%s", h.logs.String())
	}
}

func TestQueueFullDropsOldestNonCriticalFirst(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		size         int
		enqueue      []string // "c..." critical, "n..." not
		wantQueued   []string // in take order (enqueue order)
		wantFull     float64  // dropped{queue_full}
		wantFullCrit float64  // dropped{queue_full_critical}
	}{
		{"room left", 3, []string{"n1", "c1", "n2"}, []string{"n1", "c1", "n2"}, 0, 0},
		{"oldest non-critical goes", 3, []string{"n1", "n2", "n3", "n4"}, []string{"n2", "n3", "n4"}, 1, 0},
		{"critical kept over older non-critical", 3, []string{"c1", "n1", "c2", "n2", "n3"}, []string{"c1", "c2", "n3"}, 2, 0},
		{"new non-critical pushes out old one, not a critical", 2, []string{"n1", "c1", "n2"}, []string{"c1", "n2"}, 1, 0},
		{"all critical: oldest critical goes", 2, []string{"c1", "c2", "c3"}, []string{"c2", "c3"}, 0, 1},
		{"size one", 1, []string{"c1", "n1", "n2"}, []string{"n2"}, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, nil, func(c *Config) { c.QueueSize = tt.size })
			for _, id := range tt.enqueue {
				if id[0] == 'c' {
					h.u.Enqueue(crit(id))
				} else {
					h.u.Enqueue(norm(id))
				}
			}
			if got := h.metric(t, mp+"queue_length"); got != float64(len(tt.wantQueued)) {
				t.Errorf("queue_length = %v, want %d", got, len(tt.wantQueued))
			}
			if got := h.metric(t, mp+"dropped_total", "reason", DropQueueFull); got != tt.wantFull {
				t.Errorf("dropped_total{queue_full} = %v, want %v", got, tt.wantFull)
			}
			if got := h.metric(t, mp+"dropped_total", "reason", DropQueueFullCritical); got != tt.wantFullCrit {
				t.Errorf("dropped_total{queue_full_critical} = %v, want %v", got, tt.wantFullCrit)
			}
			if got := h.metric(t, mp+"enqueued_findings_total"); got != float64(len(tt.enqueue)) {
				t.Errorf("enqueued_findings_total = %v, want %d", got, len(tt.enqueue))
			}
			var got []string
			for _, f := range h.u.q.take(100) {
				got = append(got, f.ID)
			}
			// take puts critical ones first only when it cannot take them all;
			// here it takes everything, so the order is the enqueue order.
			if !slices.Equal(got, tt.wantQueued) {
				t.Errorf("queued = %v, want %v", got, tt.wantQueued)
			}
			if tt.wantFull+tt.wantFullCrit > 0 && count(h.logs.String(), "uplink queue full") != 1 {
				t.Errorf("overflow not logged exactly once:\n%s", h.logs.String())
			}
		})
	}
}

func TestEnqueueNeverBlocksWhileSenderIsStuck(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	h := newHarness(t, func(n int, _ finding.Report, r *http.Request) (int, string) {
		if n == 1 {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		return http.StatusOK, `{}`
	}, func(c *Config) {
		c.QueueSize = 10
		c.FlushInterval, c.HeartbeatInterval = time.Hour, time.Hour
	})
	h.run(t)
	h.u.Enqueue(crit("c0"))
	h.col.next(t) // the sender is now stuck in its first request

	const flood = 1000
	for i := range flood {
		h.u.Enqueue(norm("n" + strconv.Itoa(i)))
	}
	// Reaching this line is the assertion that Enqueue did not block.
	if got := h.metric(t, mp+"dropped_total", "reason", DropQueueFull); got != flood-10 {
		t.Errorf("dropped_total{queue_full} = %v, want %d", got, flood-10)
	}
	if got := h.metric(t, mp+"queue_length"); got != 10 {
		t.Errorf("queue_length = %v, want 10", got)
	}
	close(release)
}

func TestHeartbeat(t *testing.T) {
	t.Parallel()
	hb1 := finding.Heartbeat{DriverVersion: "570.1", GPUCount: 8,
		Monitors: []finding.MonitorState{{Name: "kmsg", State: finding.StateOK, Since: t0}}}
	hb2 := hb1
	hb2.Monitors = []finding.MonitorState{{Name: "kmsg", State: finding.StateUnknown, Since: t0, Reason: "EPIPE"}}

	h := newHarness(t, nil, func(c *Config) {
		c.FlushInterval = 5 * time.Second
		c.HeartbeatInterval = 30 * time.Second
	})
	h.u.SetHeartbeat(hb1)
	h.run(t)

	expectHeartbeat := func(step time.Duration, want finding.Heartbeat) {
		t.Helper()
		h.clk.waitIdle(t)
		h.col.none(t)
		h.clk.Step(step)
		r := h.col.next(t)
		if len(r.report.Findings) != 0 || !strings.Contains(r.raw, `"findings":[]`) {
			t.Fatalf("heartbeat report #%d: findings = %s, want []", r.n, r.raw)
		}
		if r.report.Heartbeat == nil || r.report.Heartbeat.DriverVersion != want.DriverVersion ||
			!slices.EqualFunc(r.report.Heartbeat.Monitors, want.Monitors, func(a, b finding.MonitorState) bool {
				return a.Name == b.Name && a.State == b.State && a.Reason == b.Reason && a.Since.Equal(b.Since)
			}) {
			t.Fatalf("heartbeat report #%d carries %+v, want %+v", r.n, r.report.Heartbeat, want)
		}
		checkEnvelope(t, h, r)
	}
	expectHeartbeat(5*time.Second, hb1)  // first flush point: the agent announces itself
	expectHeartbeat(30*time.Second, hb1) // nothing to say: still a heartbeat every 30s
	h.u.SetHeartbeat(hb1)                // unchanged: nothing sent
	h.u.SetHeartbeat(hb2)                // changed: sent at the next flush point
	expectHeartbeat(5*time.Second, hb2)
	h.clk.waitIdle(t)
	h.col.none(t)

	h.u.Enqueue(crit("c1"))
	if r := h.col.next(t); r.report.Heartbeat == nil || r.report.Heartbeat.Monitors[0].State != finding.StateUnknown {
		t.Fatalf("finding report carries heartbeat %+v, want the latest", r.report.Heartbeat)
	}
	h.clk.waitIdle(t)
	if got := h.metric(t, mp+"sent_reports_total"); got != 4 {
		t.Errorf("sent_reports_total = %v, want 4", got)
	}
}

func TestInvalidHeartbeatIgnored(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil, nil)
	h.u.SetHeartbeat(finding.Heartbeat{GPUCount: 8})
	h.u.SetHeartbeat(finding.Heartbeat{Monitors: []finding.MonitorState{{Name: "dcgm", State: "broken"}}})
	if hb, _ := h.u.heartbeat(); hb == nil || hb.GPUCount != 8 {
		t.Fatalf("heartbeat = %+v, want the last valid one", hb)
	}
	if !strings.Contains(h.logs.String(), "ignore invalid heartbeat") {
		t.Fatal("invalid heartbeat not logged")
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		respond   respondFunc
		enqueue   []string
		startIdle bool   // wait for the sender to be idle (or in backoff) before cancelling
		wantErr   string // "" means Run returns nil
		wantSent  []string
		wantLost  float64
	}{
		{name: "idle", startIdle: true},
		{name: "last flush delivers waiting findings", enqueue: []string{"n1", "n2"}, startIdle: true,
			wantSent: []string{"n1", "n2"}},
		{name: "controller down: in-flight batch counted as lost",
			respond: func(int, finding.Report, *http.Request) (int, string) {
				return http.StatusServiceUnavailable, `{"message":"down"}`
			},
			enqueue: []string{"c1", "n1", "n2"}, startIdle: true,
			wantErr: "flush uplink at shutdown: 3 findings not delivered", wantLost: 3},
		{name: "controller hangs: last flush bounded by ShutdownTimeout",
			respond: func(_ int, _ finding.Report, r *http.Request) (int, string) {
				<-r.Context().Done()
				return http.StatusOK, `{}`
			},
			enqueue: []string{"c1"},
			wantErr: "1 findings not delivered", wantLost: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, tt.respond, func(c *Config) {
				c.FlushInterval, c.HeartbeatInterval = 24*time.Hour, 24*time.Hour
				c.ShutdownTimeout = 200 * time.Millisecond
			})
			for _, id := range tt.enqueue {
				if id[0] == 'c' {
					h.u.Enqueue(crit(id))
				} else {
					h.u.Enqueue(norm(id))
				}
			}
			stop := h.run(t)
			if len(tt.enqueue) > 0 && tt.enqueue[0][0] == 'c' {
				h.col.next(t) // first attempt made
			}
			if tt.startIdle {
				h.clk.waitIdle(t)
			}
			err := stop()
			if tt.wantErr == "" && err != nil {
				t.Fatalf("Run = %v, want nil", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("Run = %v, want %q", err, tt.wantErr)
			}
			var sent []string
			for len(h.col.ch) > 0 {
				r := <-h.col.ch
				if tt.respond == nil {
					sent = append(sent, r.ids()...)
				}
			}
			if !slices.Equal(sent, tt.wantSent) {
				t.Errorf("delivered %v, want %v", sent, tt.wantSent)
			}
			if got := h.metric(t, mp+"dropped_total", "reason", DropShutdown); got != tt.wantLost {
				t.Errorf("dropped_total{shutdown} = %v, want %v", got, tt.wantLost)
			}
			if got := h.metric(t, mp+"queue_length"); got != 0 {
				t.Errorf("queue_length = %v, want 0", got)
			}
		})
	}
}

func TestRunTwice(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil, nil)
	h.run(t)
	h.clk.waitIdle(t)
	stop2 := h.run(t)
	if err := stop2(); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Fatalf("second Run = %v, want an already-running error", err)
	}
}

func TestTokenFileReadPerRequest(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("tok1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, nil, func(c *Config) {
		c.Token, c.TokenFile = "", path
		c.FlushInterval, c.HeartbeatInterval = time.Hour, time.Hour
	})
	h.run(t)
	h.u.Enqueue(crit("c1"))
	if got := h.col.next(t).header.Get("Authorization"); got != "Bearer tok1" {
		t.Fatalf("Authorization = %q", got)
	}
	if err := os.WriteFile(path, []byte("tok2"), 0o600); err != nil { // kubelet rotated it
		t.Fatal(err)
	}
	h.u.Enqueue(crit("c2"))
	if got := h.col.next(t).header.Get("Authorization"); got != "Bearer tok2" {
		t.Fatalf("Authorization after rotation = %q", got)
	}
}

func TestPhaseSpreadsNodes(t *testing.T) {
	t.Parallel()
	const every = 5 * time.Second
	phase := func(node string, r float64) time.Duration {
		u := &Uplink{cfg: Config{Cluster: "c1", Node: node, FlushInterval: every, Rand: func() float64 { return r }}}
		return u.phase()
	}
	seen := map[time.Duration]bool{}
	buckets := make([]int, 5)
	for i := range 1000 {
		p := phase("gpu-node-"+strconv.Itoa(i), 0)
		if p < 0 || p >= every {
			t.Fatalf("phase %v outside [0, %v)", p, every)
		}
		seen[p] = true
		buckets[p/time.Second]++
	}
	if len(seen) < 990 {
		t.Errorf("only %d distinct phases for 1000 nodes", len(seen))
	}
	for i, n := range buckets { // roughly uniform: 200 each
		if n < 120 || n > 280 {
			t.Errorf("phase bucket %d has %d of 1000 nodes: not spread", i, n)
		}
	}
	if phase("n1", 0) != phase("n1", 0) {
		t.Error("phase is not deterministic")
	}
	if d := (phase("n1", 0.99) - phase("n1", 0) + every) % every; d <= 0 || d > every/10 {
		t.Errorf("jitter moved the phase by %v, want (0, %v]", d, every/10)
	}
}

func TestGrid(t *testing.T) {
	t.Parallel()
	g := grid{origin: t0.Add(2 * time.Second), every: 5 * time.Second}
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	tests := []struct {
		t          float64
		next, prev float64
	}{
		{0, 2, 2}, {2, 2, 2}, {2.001, 7, 2}, {6.9, 7, 2}, {7, 7, 7}, {33, 37, 32},
	}
	for _, tt := range tests {
		if got := g.next(at(tt.t)); !got.Equal(at(tt.next)) {
			t.Errorf("next(%v) = %v, want %v", tt.t, got.Sub(t0), tt.next)
		}
		if got := g.prev(at(tt.t)); !got.Equal(at(tt.prev)) {
			t.Errorf("prev(%v) = %v, want %v", tt.t, got.Sub(t0), tt.prev)
		}
	}
}

func TestErrorMessage(t *testing.T) {
	t.Parallel()
	tests := []struct{ body, want string }{
		{`{"message":"invalid report","detail":"x","validations":["a"]}`, `invalid report: x validations=["a"]`},
		{`{"message":"invalid report"}`, `invalid report`},
		{`<html>bad gateway</html>`, `"<html>bad gateway</html>"`},
		{``, `""`},
	}
	for _, tt := range tests {
		if got, _ := errorMessage(strings.NewReader(tt.body)); got != tt.want {
			t.Errorf("errorMessage(%q) = %q, want %q", tt.body, got, tt.want)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		v    string
		want time.Duration
	}{
		{"", 0}, {"7", 7 * time.Second}, {"-1", 0}, {"soon", 0},
		{t0.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{t0.Add(-time.Second).Format(http.TimeFormat), 0},
	}
	for _, tt := range tests {
		h := http.Header{}
		if tt.v != "" {
			h.Set("Retry-After", tt.v)
		}
		if got := retryAfter(h, t0); got != tt.want {
			t.Errorf("retryAfter(%q) = %v, want %v", tt.v, got, tt.want)
		}
	}
}

func TestMetricNames(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil, nil)
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, strings.TrimPrefix(mf.GetName(), mp))
	}
	want := []string{"dropped_total", "enqueued_findings_total", "last_success_timestamp_seconds",
		"queue_length", "rejected_total", "retries_total", "send_errors_total", "sent_findings_total", "sent_reports_total", "spool_findings"}
	if !slices.Equal(names, want) {
		t.Fatalf("metrics = %v, want %v", names, want)
	}
}

// TestRejectedItemsAreDroppedAlone: a 400 naming one finding (or the
// heartbeat) drops only that item; the rest of the batch is sent again at
// once (issue 11: a NUL in a heartbeat string cost the agent its batch).
func TestRejectedItemsAreDroppedAlone(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(n int, rep finding.Report, _ *http.Request) (int, string) {
		switch {
		case n == 1:
			return http.StatusBadRequest, `{"message":"invalid report","validations":["findings[1].xid: 123456 is not an Xid number"]}`
		case rep.Heartbeat != nil:
			return http.StatusBadRequest, `{"message":"invalid report","validations":["heartbeat.monitors[0].state: \"weird\" is not one of ok, failing, unknown, absent"]}`
		}
		return http.StatusOK, `{}`
	}, func(c *Config) {
		c.FlushInterval = time.Hour
		c.HeartbeatInterval = time.Hour
	})
	h.u.SetHeartbeat(finding.Heartbeat{DriverVersion: "550.54"})
	h.u.Enqueue(norm("a"))
	h.u.Enqueue(norm("b"))
	h.u.Enqueue(crit("c"))
	h.run(t)
	if got := h.col.next(t).ids(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("first report = %v", got)
	}
	if got := h.col.next(t).ids(); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("after findings[1] was refused the controller got %v, want [a c]", got)
	}
	r := h.col.next(t)
	if got := r.ids(); !slices.Equal(got, []string{"a", "c"}) || r.report.Heartbeat != nil {
		t.Fatalf("after the heartbeat was refused the controller got %v (heartbeat %v), want [a c] without it", got, r.report.Heartbeat)
	}
	h.clk.waitIdle(t)
	if got := h.metric(t, mp+"dropped_total", "reason", DropRejected); got != 1 {
		t.Errorf("dropped_total{rejected} = %v, want 1 (only b)", got)
	}
	if got := h.metric(t, mp+"sent_findings_total"); got != 2 {
		t.Errorf("sent_findings_total = %v, want 2", got)
	}
}

// TestCAFile: with CAFile the agent trusts the controller's HTTPS
// certificate (and only certificates from that CA).
func TestCAFile(t *testing.T) {
	t.Parallel()
	got := make(chan string, 1)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var rep finding.Report
		_ = json.NewDecoder(r.Body).Decode(&rep)
		select {
		case got <- rep.Node:
		default:
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
	}))
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	u, err := New(Config{URL: srv.URL, Cluster: "c1", Node: "node-a1", BootID: "b1", CAFile: ca, HeartbeatInterval: 10 * time.Millisecond,
		FlushInterval: 10 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = u.Run(ctx) }()
	select {
	case n := <-got:
		if n != "node-a1" {
			t.Fatalf("report for %q", n)
		}
	case <-time.After(guard):
		t.Fatal("no report over HTTPS with the CA file")
	}
	bad := filepath.Join(t.TempDir(), "bad.pem")
	_ = os.WriteFile(bad, []byte("not a certificate"), 0o600)
	if _, err := New(Config{URL: srv.URL, Cluster: "c1", Node: "n", BootID: "b", CAFile: bad}); err == nil || !strings.Contains(err.Error(), "caFile") {
		t.Fatalf("a CA file without certificates: %v", err)
	}
}

// TestSharedMetrics: uplinks built with one NewMetrics set count on it
// together (counters add up, queue_length is the sum of their queues), and a
// Config setting both Metrics and Registerer is refused.
func TestSharedMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	shared, err := NewMetrics(reg)
	if err != nil {
		t.Fatalf("NewMetrics: %v", err)
	}
	if _, err := NewMetrics(reg); err == nil {
		t.Fatal("NewMetrics on a registry that has the set: nil error, want a registration error")
	}
	share := func(c *Config) { c.Registerer, c.Metrics = nil, shared }
	hs := []*harness{newHarness(t, nil, share), newHarness(t, nil, share)}
	for _, h := range hs {
		h.reg = reg
	}
	hs[0].u.Enqueue(crit("a1"))
	hs[0].u.Enqueue(crit("a2"))
	hs[1].u.Enqueue(crit("b1"))
	if v := hs[0].metric(t, mp+"queue_length"); v != 3 {
		t.Fatalf("queue_length before Run = %v, want 3 (both queues)", v)
	}
	if v := hs[0].metric(t, mp+"enqueued_findings_total"); v != 3 {
		t.Fatalf("enqueued_findings_total = %v, want 3", v)
	}
	var got []string
	reports := 0
	for i, h := range hs {
		h.run(t)
		for n := len(got); len(got) < n+2-i; {
			r := h.col.next(t)
			reports++
			got = append(got, r.ids()...)
		}
		h.clk.waitIdle(t)
		h.col.none(t)
	}
	slices.Sort(got)
	if want := []string{"a1", "a2", "b1"}; !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
	for name, want := range map[string]float64{"sent_findings_total": 3, "sent_reports_total": float64(reports), "queue_length": 0} {
		if v := hs[0].metric(t, mp+name); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}

	cfg := Config{URL: "http://127.0.0.1:9", Cluster: "c1", Node: "node-a1", BootID: "boot-1",
		Metrics: shared, Registerer: prometheus.NewRegistry()}
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "metrics and registerer") {
		t.Errorf("New with Metrics and Registerer: err = %v, want one naming both", err)
	}
}
