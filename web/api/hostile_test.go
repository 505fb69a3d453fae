package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	authnv1 "k8s.io/api/authentication/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
)

// fromSource is an HTTP client whose connections leave from ip (any
// 127.0.0.0/8 address on Linux), so tests can play several sources.
func fromSource(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 8}}
}

func postFrom(c *http.Client, url, token, body string) (int, error) {
	req, _ := http.NewRequest(http.MethodPost, url+"/api/v1/reports", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// tokenReviewServer is a real HTTP server answering TokenReviews as a
// kube-apiserver does: tokens "good-<node>" are bound to <node>, anything else
// is rejected. Each review takes a little time, as a real one does.
func tokenReviewServer(t *testing.T, calls *atomic.Int32) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/tokenreviews") {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		calls.Add(1)
		var tr authnv1.TokenReview
		if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		time.Sleep(5 * time.Millisecond)
		if node, ok := strings.CutPrefix(tr.Spec.Token, "good-"); ok {
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: tr.Spec.Audiences,
				User: authnv1.UserInfo{Username: "system:serviceaccount:fr:agent", Extra: map[string]authnv1.ExtraValue{auth.NodeNameExtra: {node}}}}
		} else {
			tr.Status = authnv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		tr.APIVersion, tr.Kind = "authentication.k8s.io/v1", "TokenReview"
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(tr)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestBadTokenFloodDoesNotLockOutAgents is issue 11's first bullet: in
// TokenReview mode, with the review client at client-go's default limits
// (QPS 5, burst 10), a flood of garbage tokens from one source must not
// delay or refuse any real agent, new tokens included, and costs the API
// server almost nothing.
func TestBadTokenFloodDoesNotLockOutAgents(t *testing.T) {
	st := pgtest.Store(t)
	var reviews atomic.Int32
	kapi := tokenReviewServer(t, &reviews)
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: kapi.URL, QPS: 5, Burst: 10,
		ContentConfig: rest.ContentConfig{ContentType: "application/json", AcceptContentTypes: "application/json"}})
	if err != nil {
		t.Fatal(err)
	}
	tr := &auth.TokenReview{Clusters: map[string]kubernetes.Interface{"c1": cs}}
	reg := prometheus.NewRegistry()
	h, err := api.Handler(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"}, Authenticator: tr,
		Registerer: reg, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	stop := make(chan struct{})
	var flood sync.WaitGroup
	var garbage, garbage429 atomic.Int32
	attacker := fromSource("127.0.0.2")
	for w := range 8 {
		flood.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				code, err := postFrom(attacker, srv.URL, fmt.Sprintf("garbage-%d-%d", w, i), report("n-x", xid("g", 79)))
				if err == nil {
					garbage.Add(1)
					if code == http.StatusTooManyRequests {
						garbage429.Add(1)
					}
				}
			}
		})
	}
	// 20 agents, each from its own address, each with a token the
	// controller has never seen, report 5 times during the flood.
	const agents, reportsEach = 20, 5
	var accepted atomic.Int32
	var good sync.WaitGroup
	for a := range agents {
		good.Go(func() {
			c := fromSource(fmt.Sprintf("127.0.1.%d", a+1))
			node := fmt.Sprintf("n-%d", a)
			for i := range reportsEach {
				code, err := postFrom(c, srv.URL, "good-"+node, report(node, xid(fmt.Sprintf("%s-%d", node, i), 79)))
				if err == nil && code == http.StatusOK {
					accepted.Add(1)
				} else {
					t.Errorf("agent %s report %d: %d %v", node, i, code, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	good.Wait()
	close(stop)
	flood.Wait()
	if got := accepted.Load(); got != agents*reportsEach {
		t.Fatalf("accepted %d of %d good reports during the flood", got, agents*reportsEach)
	}
	// The flood reached the API server at most VerifyBurst times plus the
	// refill; every good agent's token was reviewed once.
	maxReviews := int32(agents + api.DefaultVerifyBurst + 10)
	if got := reviews.Load(); got > maxReviews {
		t.Fatalf("%d TokenReviews for %d garbage requests and %d agents, want at most %d", got, garbage.Load(), agents, maxReviews)
	}
	if garbage429.Load() == 0 {
		t.Fatal("no garbage request was rate limited")
	}
	t.Logf("flood: %d garbage requests (%d answered 429), %d TokenReviews; good agents: %d/%d accepted",
		garbage.Load(), garbage429.Load(), reviews.Load(), accepted.Load(), agents*reportsEach)
	// The audit holds a handful of rows, not one per garbage request, and
	// the metric counts every denial.
	var rows int
	if err := pgxQueryRow(t, "SELECT count(*) FROM security_audit", &rows); err != nil {
		t.Fatal(err)
	}
	denied := testutil.ToFloat64(mustVec(t, reg, "fleetrepair_api_denials_total"))
	if rows > api.DefaultAuditRowsPerMinute*2+2 || denied < float64(garbage.Load()-garbage429.Load()) {
		t.Fatalf("security_audit rows = %d, denials counted = %v for %d garbage requests", rows, denied, garbage.Load())
	}
}

// mustVec sums a counter family of reg by name.
func mustVec(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "sum"})
	c.Add(sum)
	return c
}

// pgxQueryRow runs one query on the test database.
func pgxQueryRow(t *testing.T, q string, dst ...any) error {
	conn, err := pgx.Connect(context.Background(), pgtest.DSN(t))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(context.Background(), q).Scan(dst...)
}

// TestUnknownClusterNamesNothing: a report for a cluster this controller does
// not serve is authenticated first, and no answer lists the served clusters.
func TestUnknownClusterNamesNothing(t *testing.T) {
	e := newEnv(t)
	body := strings.Replace(report("n1", xid("a", 79)), `"cluster":"c1"`, `"cluster":"zz"`, 1)
	status, eb := e.post(t, body, "Authorization", "Bearer wrong")
	if status != http.StatusUnauthorized || strings.Contains(eb.Detail+eb.Message, "c1") {
		t.Fatalf("unknown cluster, bad token: %d %+v, want 401 naming no served cluster", status, eb)
	}
	status, eb = e.post(t, body)
	if status != http.StatusForbidden || strings.Contains(eb.Detail+eb.Message, "c1") {
		t.Fatalf("unknown cluster, good token: %d %+v, want 403 naming no served cluster", status, eb)
	}
}

// TestHostileNodeNames: node names that are not Kubernetes node names are
// refused with a 400 naming the field, and nothing is stored.
func TestHostileNodeNames(t *testing.T) {
	e := newEnv(t)
	for _, name := range []string{"gpu\u202e1", "a..b", "n1\nforged", "<script>alert(1)</script>", "../../etc", "N1"} {
		status, eb := e.post(t, report(name, xid("a", 79)))
		if status != http.StatusBadRequest || !strings.Contains(strings.Join(eb.Validations, ";"), "node: ") {
			t.Errorf("node %q: %d %+v, want 400 naming node", name, status, eb)
		}
	}
	nodes, err := e.st.ListNodes(context.Background(), "c1")
	if err != nil || len(nodes) != 0 {
		t.Fatalf("stored nodes %+v (%v), want none", nodes, err)
	}
}

// TestFutureSentAtDoesNotFreezeNode: a report whose sentAt is far in the
// future is clamped, so the node's next boot is applied; a row frozen
// before the clamp existed heals with the next report.
func TestFutureSentAtDoesNotFreezeNode(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	send := func(boot string, sentAt time.Time, fs ...finding.Finding) {
		t.Helper()
		e.sendAt(t, boot, sentAt, fs...)
	}
	future := xid("future", 79)
	future.Time = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
	send("boot-1", time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC), future)
	send("boot-2", time.Now())
	n, err := e.st.GetNode(ctx, "c1", "n1")
	if err != nil || n.BootID != "boot-2" {
		t.Fatalf("after a reboot, node boot ID = %q (%v), want boot-2 (the 9999 sentAt froze it)", n.BootID, err)
	}
	fs, _ := e.st.FindingsForNode(ctx, "c1", "n1", time.Time{}, 0)
	if len(fs) != 1 || fs[0].Time.Year() == 9999 || fs[0].Attrs["agent_time"] == "" {
		t.Fatalf("future finding stored as %+v, want its time clamped and the agent's time kept in attrs", fs)
	}
	// A row frozen by an older controller: the store does not trust it.
	conn, err := pgx.Connect(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `UPDATE nodes SET last_sent_at = '9999-12-31' WHERE cluster = 'c1' AND name = 'n1'`); err != nil {
		t.Fatal(err)
	}
	send("boot-3", time.Now())
	if n, _ := e.st.GetNode(ctx, "c1", "n1"); n.BootID != "boot-3" {
		t.Fatalf("a frozen row kept boot ID %q, want boot-3", n.BootID)
	}
}

// TestNULInHeartbeatIsStored: NUL bytes (and other control bytes) in
// heartbeat strings, every field of it, are escaped and stored, never a 400
// carrying PostgreSQL's error.
func TestNULInHeartbeatIsStored(t *testing.T) {
	e := newEnv(t)
	r := finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: "n1", BootID: "b1", SentAt: time.Now(),
		Findings: []finding.Finding{xid("a", 79)},
		Heartbeat: &finding.Heartbeat{DriverVersion: "550\x00.54", KernelVersion: "6.1\x00", Image: "ami-\x00\x1b[2J",
			ModuleVersion: "550.54\x00", LibraryVersion: "550\x00",
			Monitors: []finding.MonitorState{{Name: "nvml\x00", State: finding.StateOK, Reason: "\x00"}},
			GPUs:     []finding.GPU{{Index: 0, PCI: "0000:3b:00.0", Model: "H100\x00"}}}}
	b, _ := json.Marshal(r)
	if status, eb := e.post(t, string(b)); status != http.StatusOK {
		t.Fatalf("heartbeat with NUL bytes: %d %+v", status, eb)
	}
	n, err := e.st.GetNode(context.Background(), "c1", "n1")
	if err != nil || n.DriverVersion != `550\x00.54` {
		t.Fatalf("driver version stored as %q (%v)", n.DriverVersion, err)
	}
}

// TestStateChangesAreSameOriginJSON: with --agent-auth=none a web page must
// not be able to post a report (or approve a repair): no JSON content type,
// or a cross-site browser request, is refused before anything is read.
func TestStateChangesAreSameOriginJSON(t *testing.T) {
	st := pgtest.Store(t)
	h, err := api.Handler(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	for name, tc := range map[string]struct {
		path string
		hdr  map[string]string
		want int
	}{
		"no content type":     {"/api/v1/reports", map[string]string{}, 415},
		"form post":           {"/api/v1/reports", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415},
		"text/plain":          {"/api/v1/reports", map[string]string{"Content-Type": "text/plain"}, 415},
		"cross-site fetch":    {"/api/v1/reports", map[string]string{"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, 403},
		"foreign origin":      {"/api/v1/reports", map[string]string{"Content-Type": "application/json", "Origin": "https://evil.example"}, 403},
		"approve, no type":    {"/api/v1/repairs/1/approve", map[string]string{}, 415},
		"kill switch, origin": {"/api/v1/breakers/kill-switch", map[string]string{"Content-Type": "application/json", "Origin": "http://evil.example"}, 403},
		"same origin":         {"/api/v1/reports", map[string]string{"Content-Type": "application/json", "Origin": srv.URL, "Sec-Fetch-Site": "same-origin"}, 200},
	} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+tc.path, strings.NewReader(report("n1", xid("a-"+strings.ReplaceAll(name, " ", "-"), 79))))
		for k, v := range tc.hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: %d, want %d", name, resp.StatusCode, tc.want)
		}
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" || resp.Header.Get("Cache-Control") != "no-store" {
			t.Errorf("%s: security headers missing: %v", name, resp.Header)
		}
	}
	fs, _ := st.FindingsForNode(context.Background(), "c1", "n1", time.Time{}, 0)
	if len(fs) != 1 {
		t.Fatalf("stored %d findings, want only the same-origin one", len(fs))
	}
}

// TestAgentRateLimit: one agent posting faster than Limits.AgentRPS is
// answered 429 with Retry-After, which the agent honours.
func TestAgentRateLimit(t *testing.T) {
	st := pgtest.Store(t)
	h, err := api.Handler(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"}, Limits: api.Limits{AgentRPS: 0.001, AgentBurst: 3},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	var codes []int
	for i := range 5 {
		code, err := postFrom(http.DefaultClient, srv.URL, "", report("n1", xid(fmt.Sprint(i), 79)))
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, code)
	}
	if fmt.Sprint(codes) != "[200 200 200 429 429]" {
		t.Fatalf("codes = %v, want three accepted then 429", codes)
	}
	if code, _ := postFrom(http.DefaultClient, srv.URL, "", report("n2", xid("other", 79))); code != http.StatusOK {
		t.Fatalf("another agent: %d, want 200 (limits are per agent)", code)
	}
}

// TestManyAgentsBehindOneSource: agents behind one NAT or load balancer
// share a source address; the per-source limit of the read routes must not
// refuse their reports (each agent has its own limit).
func TestManyAgentsBehindOneSource(t *testing.T) {
	st := pgtest.Store(t)
	h, err := api.Handler(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"}, Limits: api.Limits{SourceRPS: 5},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	for i := range 30 {
		code, err := postFrom(http.DefaultClient, srv.URL, "", report(fmt.Sprintf("n%d", i), xid(fmt.Sprint(i), 79)))
		if err != nil {
			t.Fatal(err)
		}
		if code != http.StatusOK {
			t.Fatalf("report %d of 30 agents on one source: %d, want 200", i, code)
		}
	}
	var last int
	for range 10 { // the read routes still have the per-source limit
		resp, err := http.Get(srv.URL + "/api/v1/repairs")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		last = resp.StatusCode
	}
	if last != http.StatusTooManyRequests {
		t.Fatalf("11th read in a second from one source: %d, want 429", last)
	}
}

// sendAt posts a report of node c1/n1 in boot with sentAt and fs and fails
// the test unless it is answered 200.
func (e *env) sendAt(t *testing.T, boot string, sentAt time.Time, fs ...finding.Finding) {
	t.Helper()
	r := finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: "n1", BootID: boot, SentAt: sentAt, Findings: fs}
	if fs == nil {
		r.Findings = []finding.Finding{}
	}
	b, _ := json.Marshal(r)
	if status, eb := e.post(t, string(b)); status != http.StatusOK {
		t.Fatalf("report boot %s: %d %+v", boot, status, eb)
	}
}
