package api_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"
	authnv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
)

// benchNodes is the fleet of BenchmarkIngestRoute: 10,000 agents, each
// heartbeating with an unchanged inventory (the steady state of the load
// harness, docs/scale.md).
const benchNodes = 10000

// benchAgents is how many agents post at once per GOMAXPROCS (as the
// store's BenchmarkIngestHeartbeat).
const benchAgents = 32

// heartbeatReport is what agent/pipeline publishes for a healthy 8-GPU node
// (six monitors, NVML inventory) and agent/uplink sends as its heartbeat: no
// findings, the Heartbeat inventory.
func heartbeatReport(cluster, node string, sentAt time.Time) finding.Report {
	since := time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)
	hb := &finding.Heartbeat{DriverVersion: "550.54.15", KernelVersion: "6.8.0-1015-aws", ModuleVersion: "550.54.15",
		LibraryVersion: "550.54.15", Image: "ami-0a1b2c3d4e5f67890", GPUCount: 8}
	for _, m := range []string{"cri", "dcgm", "kmsg", "kubelet", "nvml", "procfs"} {
		hb.Monitors = append(hb.Monitors, finding.MonitorState{Name: m, State: finding.StateOK, Since: since})
	}
	for i := range 8 {
		hb.GPUs = append(hb.GPUs, finding.GPU{Index: i, PCI: fmt.Sprintf("0000:%02x:00.0", 0x18+i*0x10),
			UUID:   fmt.Sprintf("GPU-%08x-1f2e-4d3c-8b7a-%012x", i, len(node)*1000+i),
			Serial: fmt.Sprintf("165402%07d", i), Model: "NVIDIA H100 80GB HBM3", PCIID: "10de:2330"})
	}
	return finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: cluster, Node: node, BootID: "6f1c2d3e-4b5a-4978-8a9b-0c1d2e3f4a5b",
		AgentVersion: "1.4.2", SentAt: sentAt, Findings: []finding.Finding{}, Heartbeat: hb}
}

// heartbeatBody builds node's heartbeat body with a fresh sentAt cheaply:
// the report is marshalled once (as agent/uplink marshals it) and only the
// sentAt value is spliced in per request.
type heartbeatBody struct{ before, after []byte }

func newHeartbeatBody(b testing.TB, cluster, node string) heartbeatBody {
	const marker = "2001-02-03T04:05:06.000000007Z"
	raw, err := json.Marshal(heartbeatReport(cluster, node, time.Date(2001, 2, 3, 4, 5, 6, 7, time.UTC)))
	if err != nil {
		b.Fatal(err)
	}
	i := bytes.Index(raw, []byte(marker))
	if i < 0 {
		b.Fatalf("no sentAt in %s", raw)
	}
	return heartbeatBody{before: raw[:i], after: raw[i+len(marker):]}
}

func (h heartbeatBody) at(dst []byte, t time.Time) []byte {
	dst = append(dst[:0], h.before...)
	dst = t.UTC().AppendFormat(dst, time.RFC3339Nano)
	return append(dst, h.after...)
}

// tokenReviewer is a TokenReview authenticator whose cache is hot: every
// agent's token (one per node, bound to its node) was reviewed once before
// the benchmark, through a client-go fake clientset answering as the API
// server does for a bound ServiceAccount token, so the measured requests
// are served from the cache (the production path once agents heartbeat).
func tokenReviewer(b testing.TB, cluster string, nodes int) (*auth.TokenReview, func(i int) string) {
	cs := fake.NewClientset()
	var reviews atomic.Int64
	cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		reviews.Add(1)
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		node, _ := strings.CutPrefix(tr.Spec.Token, "token-of-")
		tr.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: tr.Spec.Audiences,
			User: authnv1.UserInfo{Username: "system:serviceaccount:fleetrepair:fleetrepair-agent",
				Extra: map[string]authnv1.ExtraValue{auth.NodeNameExtra: {node}}}}
		return true, tr, nil
	})
	tr := &auth.TokenReview{Clusters: map[string]kubernetes.Interface{cluster: cs}, TTL: time.Hour}
	tok := func(i int) string { return fmt.Sprintf("token-of-n%d", i) }
	for i := range nodes {
		if _, err := tr.Authenticate(context.Background(), tok(i), cluster); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		if n := reviews.Load(); n != int64(nodes) {
			b.Errorf("%d TokenReviews for %d agents: the cache was not hot", n, nodes)
		}
	})
	return tr, tok
}

// cpuTime is this process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkIngestRoute posts unchanged heartbeats of 10,000 agents to POST
// /api/v1/reports through the real router (middleware, auth, decode,
// validation, clock clamp, rate limits, backpressure slots, answer) into
// the real store on the throwaway PostgreSQL, benchAgents x GOMAXPROCS at
// once; each must answer 200 with inserted 0. Sub-benchmarks:
//
//   - handler/static, handler/tokenreview: the handler called in-process
//     (no HTTP client or connection), with the static token or a
//     TokenReview cache holding every agent's review;
//   - http/static: over loopback TCP to api.NewServer with keep-alive
//     clients (adds net/http's server and this process's client);
//   - https/static: the same over TLS (the controller serves TLS when
//     given --tls-cert-file; not the default).
//
// Besides ns/op and allocs/op it reports reports/s and cpu-us/report, this
// process's CPU (getrusage) per report: the Go side of the route and of
// the store (pgx encoding, group commit), not PostgreSQL's. For the http
// variants it includes the benchmark's own clients.
//
//	go test ./web/api -run '^$' -bench IngestRoute -benchmem -benchtime 5s
func BenchmarkIngestRoute(b *testing.B) {
	st, err := store.Open(context.Background(), pgtest.DSN(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(st.Close)
	const cluster = "c1"
	bodies := make([]heartbeatBody, benchNodes)
	for i := range bodies {
		bodies[i] = newHeartbeatBody(b, cluster, fmt.Sprintf("n%d", i))
	}
	start := time.Now()
	// First sight of every node (the benchmark measures unchanged
	// heartbeats), 64 at a time so the store's group commit takes them.
	var seed errgroup.Group
	seed.SetLimit(64)
	for _, hb := range bodies {
		rep := heartbeatFromBody(b, hb.at(nil, start))
		seed.Go(func() error {
			_, err := st.IngestReport(context.Background(), rep, start)
			return err
		})
	}
	if err := seed.Wait(); err != nil {
		b.Fatal(err)
	}
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	static := func(int) string { return "secret" }
	tr, perNode := tokenReviewer(b, cluster, benchNodes)
	handler := func(b *testing.B, a auth.Authenticator) http.Handler {
		h, err := api.Handler(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{cluster},
			Authenticator: a, Log: discard, OnIngest: func(string, string) { b.Error("an unchanged heartbeat triggered a reconcile") }})
		if err != nil {
			b.Fatal(err)
		}
		return h
	}
	var seq atomic.Int64
	run := func(b *testing.B, token func(int) string, post func(body []byte, token string) (int, []byte)) {
		b.SetParallelism(benchAgents)
		b.ReportAllocs()
		cpu0 := cpuTime()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			var buf []byte
			for pb.Next() {
				i := int(seq.Add(1) % benchNodes)
				buf = bodies[i].at(buf, time.Now())
				code, resp := post(buf, token(i))
				var got api.IngestResponse
				if code != http.StatusOK || json.Unmarshal(resp, &got) != nil || got.Inserted != 0 {
					b.Errorf("heartbeat of n%d: %d %s", i, code, resp)
					return
				}
			}
		})
		b.StopTimer()
		cpu := cpuTime() - cpu0
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reports/s")
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/report")
	}
	inProcess := func(h http.Handler) func([]byte, string) (int, []byte) {
		return func(body []byte, token string) (int, []byte) {
			req := httptest.NewRequest(http.MethodPost, "/api/v1/reports", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+token)
			req.RemoteAddr = "10.0.0.1:40000"
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			return rec.Code, rec.Body.Bytes()
		}
	}
	b.Run("handler/static", func(b *testing.B) {
		run(b, static, inProcess(handler(b, auth.StaticToken{Token: "secret"})))
	})
	b.Run("handler/tokenreview", func(b *testing.B) {
		run(b, perNode, inProcess(handler(b, tr)))
	})
	overHTTP := func(b *testing.B, useTLS bool) func([]byte, string) (int, []byte) {
		srv := api.NewServer(handler(b, auth.StaticToken{Token: "secret"}), api.ServerOptions{Log: discard})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		tr := &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096} // not http.DefaultTransport: TestMain wraps it in the OpenAPI check
		scheme := "http"
		if useTLS {
			ts := httptest.NewUnstartedServer(nil) // only for its self-signed certificate
			ts.StartTLS()
			cert := ts.TLS.Certificates
			pool := ts.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
			ts.Close()
			srv.TLSConfig = &tls.Config{Certificates: cert}
			tr.TLSClientConfig = &tls.Config{RootCAs: pool}
			go func() { _ = srv.ServeTLS(ln, "", "") }()
			scheme = "https"
		} else {
			go func() { _ = srv.Serve(ln) }()
		}
		b.Cleanup(func() { _ = srv.Close(); tr.CloseIdleConnections() })
		url := scheme + "://" + ln.Addr().String() + "/api/v1/reports"
		client := &http.Client{Transport: tr}
		return func(body []byte, token string) (int, []byte) {
			req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := client.Do(req)
			if err != nil {
				return 0, []byte(err.Error())
			}
			defer resp.Body.Close()
			out, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, out
		}
	}
	b.Run("http/static", func(b *testing.B) { run(b, static, overHTTP(b, false)) })
	b.Run("https/static", func(b *testing.B) { run(b, static, overHTTP(b, true)) })
	// The heartbeat goal: 100,000 nodes every 30 s, open loop.
	b.Run("http/static/paced-3333", func(b *testing.B) {
		paced(b, 100_000.0/30, func(i int) []byte { return bodies[i%benchNodes].at(nil, time.Now()) }, overHTTP(b, false))
	})
}

// paced posts b.N heartbeats (body(i)) at rps a second, open loop: each is
// sent on its schedule whether or not the earlier ones were answered, as
// independent agents do, with at most 4,096 in flight (past that the
// schedule slips). It reports the accepted reports' latency, p50-ms and
// p99-ms, their rate (reports/s) and the share answered 429 (429-%, the
// backpressure past 64 reports in flight, which an agent honours); every
// other answer must be 200 with inserted 0. A closed-loop benchmark (run) measures a saturated
// server, whose latency is its queue; this one the latency at a given
// load (docs/scale.md, "The ingest route").
func paced(b *testing.B, rps float64, body func(int) []byte, post func([]byte, string) (int, []byte)) {
	// A burst of 10 ms of requests: a timer sleeps about a millisecond at
	// best, so a burst of 1 ran 1,785/s of the 3,333 asked.
	lim := rate.NewLimiter(rate.Limit(rps), max(1, int(rps/100)))
	lat := make([]time.Duration, b.N)
	sem := make(chan struct{}, 4096)
	var (
		wg   sync.WaitGroup
		shed atomic.Int64
	)
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		if err := lim.Wait(context.Background()); err != nil {
			b.Fatal(err)
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			t0 := time.Now()
			code, resp := post(body(n), "secret")
			lat[n] = time.Since(t0)
			if code == http.StatusTooManyRequests {
				shed.Add(1) // the backpressure an agent honours (Retry-After)
				lat[n] = -1
				return
			}
			var got api.IngestResponse
			if code != http.StatusOK || json.Unmarshal(resp, &got) != nil || got.Inserted != 0 {
				b.Errorf("heartbeat %d: %d %s", n, code, resp)
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	slices.Sort(lat)
	lat = lat[shed.Load():] // the accepted ones
	q := func(f float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[min(len(lat)-1, int(f*float64(len(lat))))].Microseconds()) / 1000
	}
	b.ReportMetric(float64(len(lat))/b.Elapsed().Seconds(), "reports/s")
	b.ReportMetric(100*float64(shed.Load())/float64(b.N), "429-%")
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
}

func heartbeatFromBody(b testing.TB, body []byte) finding.Report {
	var r finding.Report
	if err := json.Unmarshal(body, &r); err != nil {
		b.Fatal(err)
	}
	return r
}
