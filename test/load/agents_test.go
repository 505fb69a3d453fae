package load

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/uplink"
)

// stalledListener is a TCP listener on 127.0.0.1 with a backlog of one
// that never accepts: a controller too busy to accept, its accept queue
// full, as the 100,000-node run saw (agents' POSTs timing out). Connects
// beyond the backlog wait in SYN retries (net.ipv4.tcp_syn_retries, about
// two minutes with the default 6).
func stalledListener(tb testing.TB) *url.URL {
	tb.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		tb.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		tb.Fatal(err)
	}
	if err := syscall.Listen(fd, 1); err != nil {
		tb.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "stalled")
	l, err := net.FileListener(f)
	f.Close()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return &url.URL{Scheme: "http", Host: l.Addr().String()}
}

// hangingListener accepts connections and reads from them but never
// answers: a controller that accepts and then stalls.
func hangingListener(tb testing.TB) *url.URL {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	return &url.URL{Scheme: "http", Host: l.Addr().String()}
}

// BenchmarkAgentsStalledController measures what the harness's simulated
// agents (agent/uplink over the harness's shared transport, startAgents)
// hold while the controller does not answer: agents uplinks, each POST
// timing out after 500 ms and retried after 100-500 ms, for 15 s. It
// reports the goroutines, live heap and goroutine stacks per agent at the
// end (after a GC): a harness whose pending connects or connections grow
// with every timed-out attempt shows them growing with the run's length.
func BenchmarkAgentsStalledController(b *testing.B) {
	const agents = 2000
	for _, c := range []struct {
		name   string
		listen func(testing.TB) *url.URL
	}{{"backlog-full", stalledListener}, {"no-answer", hangingListener}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				u := c.listen(b)
				g0 := runtime.NumGoroutine()
				fleet := newBenchAgents(b, u, agents, func(c *uplink.Config) {
					c.FlushInterval, c.HeartbeatInterval, c.RequestTimeout = 100*time.Millisecond, time.Second, 500*time.Millisecond
					c.RetryInitialInterval, c.RetryMaxInterval = 100*time.Millisecond, 500*time.Millisecond
				})
				st := fleet.st
				fleet.start(0)
				var ms runtime.MemStats
				for s := 0; s < 15; s++ {
					time.Sleep(time.Second)
					runtime.ReadMemStats(&ms)
					b.Logf("%2ds: %d goroutines, heap %.0f MiB, stacks %.0f MiB, outcomes %+v", s+1, runtime.NumGoroutine(),
						float64(ms.HeapAlloc)/(1<<20), float64(ms.StackInuse)/(1<<20), st.counts())
				}
				runtime.GC()
				runtime.ReadMemStats(&ms)
				b.ReportMetric(float64(runtime.NumGoroutine()-g0)/agents, "goroutines/agent")
				b.ReportMetric(float64(ms.HeapAlloc)/agents, "heap-B/agent")
				b.ReportMetric(float64(ms.StackInuse)/agents, "stack-B/agent")
				fleet.stop()
			}
		})
	}
}

// benchAgents are n simulated agents for the agent benchmarks, built as
// startAgents builds them: real uplinks over the harness's transports
// (newAgentTransports) and agentTransport, one metric set, each agent
// under a context of its own.
type benchAgents struct {
	st      *agentStats
	bases   agentTransports
	ups     []*uplink.Uplink
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}
	started atomic.Int64
	looped  chan struct{} // closed when start has started every agent it will
}

// newBenchAgents builds n agents of cluster "c" posting to u, their
// uplink.Config changed by tune (nil: the uplink's defaults) before New.
func newBenchAgents(tb testing.TB, u *url.URL, n int, tune func(*uplink.Config)) *benchAgents {
	tb.Helper()
	a := &benchAgents{st: newAgentStats(), bases: newAgentTransports(1), done: make(chan struct{}, n), looped: make(chan struct{})}
	um, err := uplink.NewMetrics(nil)
	if err != nil {
		tb.Fatal(err)
	}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	for i := range n {
		tr := &agentTransport{base: a.bases.forAgent(i), urls: []*url.URL{u}, st: a.st}
		cfg := uplink.Config{URL: u.String(), Cluster: "c", Node: fmt.Sprintf("n-%05d", i), BootID: "boot",
			AgentVersion: "load", Token: token, HTTPClient: &http.Client{Transport: tr}, ShutdownTimeout: time.Millisecond,
			Logger: slog.New(slog.DiscardHandler), Metrics: um}
		if tune != nil {
			tune(&cfg)
		}
		up, err := uplink.New(cfg)
		if err != nil {
			tb.Fatal(err)
		}
		up.SetHeartbeat(finding.Heartbeat{DriverVersion: "550.54.15", KernelVersion: "6.8.0-1015-aws", GPUCount: 8,
			Monitors: []finding.MonitorState{{Name: "kmsg", State: finding.StateOK, Since: time.Now()}}})
		a.ups = append(a.ups, up)
	}
	return a
}

// start runs the agents, all at once or evenly over ramp (rampDelay),
// from a goroutine of its own.
func (a *benchAgents) start(ramp time.Duration) {
	begin := time.Now()
	go func() {
		defer close(a.looped)
		for i, up := range a.ups {
			if ramp > 0 {
				sleepCtx(a.ctx, time.Until(begin.Add(rampDelay(i, len(a.ups), ramp))))
			}
			if a.ctx.Err() != nil {
				return
			}
			actx, cancel := context.WithCancel(a.ctx)
			a.started.Add(1)
			go func() { defer cancel(); _ = up.Run(actx); a.done <- struct{}{} }()
		}
	}()
}

// stop ends every started agent, waits for them and closes the idle
// connections.
func (a *benchAgents) stop() {
	a.cancel()
	<-a.looped
	for range a.started.Load() {
		<-a.done
	}
	for _, tr := range a.bases {
		tr.CloseIdleConnections()
	}
}

// TestAgentTransport checks what the simulated agents' transport records:
// the server gets the body as sent (re-readable or not), an accepted
// report's finding IDs are acknowledged, and a POST that never had a
// connection counts as no answer without one (noConn).
func TestAgentTransport(t *testing.T) {
	got := make(chan string, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- r.Host + " " + string(b)
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	st := newAgentStats()
	bases := newAgentTransports(1)
	tr := &agentTransport{base: bases.forAgent(0), urls: []*url.URL{u}, st: st}
	const body = `{"cluster":"c","node":"n","findings":[{"id":"f-1"},{"id":"f-2"}]}`
	for name, rd := range map[string]io.Reader{"re-readable": strings.NewReader(body), "read once": io.MultiReader(strings.NewReader(body))} {
		req, err := http.NewRequest(http.MethodPost, "http://placeholder"+uplink.ReportsPath, rd)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		resp.Body.Close()
		if g := <-got; g != u.Host+" "+body {
			t.Fatalf("%s: server got %q", name, g)
		}
		if req.URL.Host != "placeholder" {
			t.Fatalf("%s: the caller's request was changed: %s", name, req.URL)
		}
	}
	if _, ok := st.ackTime("f-1"); !ok || st.ackedCount() != 2 || st.ok.Load() != 2 {
		t.Fatalf("acknowledged %d findings in %d accepted POSTs, want f-1 and f-2 in 2", st.ackedCount(), st.ok.Load())
	}
	srv.Close()
	for _, b := range bases { // no stale connection to the closed server
		b.CloseIdleConnections()
	}
	req, _ := http.NewRequest(http.MethodPost, "http://placeholder"+uplink.ReportsPath, strings.NewReader(body))
	if _, err := tr.RoundTrip(req); err == nil {
		t.Fatal("POST to a closed server: no error")
	}
	if c := st.counts(); c.network != 1 || c.noConn != 1 {
		t.Fatalf("outcomes after a refused connect %+v, want network 1 and noConn 1", c)
	}
}

// BenchmarkAgentTransport measures what one accepted heartbeat POST through
// the simulated agents' transport allocates (B/op, allocs/op), the uplink's
// request built as agent/uplink builds it.
func BenchmarkAgentTransport(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) }))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	tr := &agentTransport{base: newAgentTransports(1).forAgent(0), urls: []*url.URL{u}, st: newAgentStats()}
	body := []byte(`{"schemaVersion":1,"cluster":"load","node":"gpu-a-00001","bootID":"6f1c2d3e-4b5a-4978-8a9b-0c1d2e3f4a5b","agentVersion":"load","findings":[],` +
		`"heartbeat":{"driverVersion":"550.54.15","kernelVersion":"6.8.0-1015-aws","gpuCount":8,"monitors":[{"name":"kmsg","state":"ok","since":"2026-12-01T23:00:00Z"}]}}`)
	b.ReportAllocs()
	for b.Loop() {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://placeholder"+uplink.ReportsPath, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}
