package load

import (
	"flag"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	rpprof "runtime/pprof"
	"testing"
	"time"
)

// Sizes of BenchmarkAgentsOverloadedController (docs/scale.md, "The
// harness at 100,000 agents (session 7)").
var (
	flagOverloadAgents   = flag.Int("load.overload-agents", 2000, "BenchmarkAgentsOverloadedController: simulated agents")
	flagOverloadFor      = flag.Duration("load.overload-for", 30*time.Second, "BenchmarkAgentsOverloadedController: how long each case runs")
	flagOverloadRamp     = flag.Duration("load.overload-ramp", 0, "BenchmarkAgentsOverloadedController: start the agents evenly over this (0: all at once)")
	flagOverloadProfiles = flag.String("load.overload-profiles", "", "BenchmarkAgentsOverloadedController: write heap and goroutine profiles at the end of each case into this folder")
)

// answeringServer serves POSTs on 127.0.0.1 with handler, its connections
// bounded only by the agents' transport: a controller that answers.
func answeringServer(tb testing.TB, handler http.HandlerFunc) *url.URL {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	tb.Cleanup(func() { srv.Close() })
	return &url.URL{Scheme: "http", Host: l.Addr().String()}
}

// tooManyServer answers every report 429 with Retry-After 1, at once: a
// controller with all its ingest slots taken (web/api, RetryAfterOverloaded).
func tooManyServer(tb testing.TB) *url.URL {
	return answeringServer(tb, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Retry-After", "1")
		http.Error(w, `{"message":"controller overloaded"}`, http.StatusTooManyRequests)
	})
}

// slowServer accepts every report after 2 s: a controller that keeps up,
// slowly.
func slowServer(tb testing.TB) *url.URL {
	return answeringServer(tb, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-time.After(2 * time.Second):
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"accepted":0,"inserted":0}`)
	})
}

// BenchmarkAgentsOverloadedController measures what the harness's simulated
// agents (agent/uplink with its real timings: 10 s request timeout, retries
// after 1-30 s, heartbeat 30 s, over the harness's shared bounded transport)
// hold when one controller cannot serve them all, without API servers or a
// database: a listener that accepts and never answers (no-answer), one that
// answers 429 with Retry-After at once (too-many), one that accepts after
// 2 s (slow). -load.overload-agents agents start at once (or evenly over
// -load.overload-ramp) and run for -load.overload-for; every 5 s it logs
// goroutines, live heap and goroutine stacks per agent and the POST
// outcomes, and reports them per agent at the end, after a GC.
//
//	go test -c -o /tmp/load.test ./test/load && cd test/load && /tmp/load.test -test.run '^$' \
//	  -test.bench BenchmarkAgentsOverloadedController -test.benchtime 1x -test.v \
//	  -load.overload-agents 20000 -load.overload-for 90s -load.overload-profiles /tmp/overload
func BenchmarkAgentsOverloadedController(b *testing.B) {
	agents, runFor, ramp := *flagOverloadAgents, *flagOverloadFor, *flagOverloadRamp
	for _, c := range []struct {
		name   string
		listen func(testing.TB) *url.URL
	}{{"no-answer", hangingListener}, {"too-many", tooManyServer}, {"slow", slowServer}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				runtime.GC()
				var ms0 runtime.MemStats
				runtime.ReadMemStats(&ms0)
				g0 := runtime.NumGoroutine()
				u := c.listen(b)
				fleet := newBenchAgents(b, u, agents, nil)
				st := fleet.st
				start := time.Now()
				fleet.start(ramp)
				var ms runtime.MemStats
				per := func(v uint64, base uint64) float64 { return float64(int64(v)-int64(base)) / float64(agents) / 1024 }
				for t := 5 * time.Second; t <= runFor; t += 5 * time.Second {
					time.Sleep(time.Until(start.Add(t)))
					runtime.ReadMemStats(&ms)
					b.Logf("%3.0fs: %.2f goroutines/agent, heap %.1f KiB/agent, stacks %.1f KiB/agent, agents accepted %d, outcomes %+v",
						t.Seconds(), float64(runtime.NumGoroutine()-g0)/float64(agents), per(ms.HeapAlloc, ms0.HeapAlloc),
						per(ms.StackInuse, ms0.StackInuse), st.firstOK.Load(), st.counts())
				}
				runtime.GC()
				runtime.ReadMemStats(&ms)
				b.ReportMetric(float64(runtime.NumGoroutine()-g0)/float64(agents), "goroutines/agent")
				b.ReportMetric(float64(int64(ms.HeapAlloc)-int64(ms0.HeapAlloc))/float64(agents), "heap-B/agent")
				b.ReportMetric(float64(int64(ms.StackInuse)-int64(ms0.StackInuse))/float64(agents), "stack-B/agent")
				if dir := *flagOverloadProfiles; dir != "" {
					writeProfiles(b, dir, c.name)
				}
				fleet.stop()
			}
		})
	}
}

// writeProfiles writes the heap and goroutine profiles into dir as
// NAME-heap.pb.gz and NAME-goroutine.pb.gz (`go tool pprof -top`).
func writeProfiles(tb testing.TB, dir, name string) {
	tb.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	for _, p := range []string{"heap", "goroutine"} {
		f, err := os.Create(filepath.Join(dir, name+"-"+p+".pb.gz"))
		if err != nil {
			tb.Fatal(err)
		}
		if err := rpprof.Lookup(p).WriteTo(f, 0); err != nil {
			tb.Fatal(err)
		}
		if err := f.Close(); err != nil {
			tb.Fatal(err)
		}
	}
}
