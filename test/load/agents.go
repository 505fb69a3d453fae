package load

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// agentStats is what the simulated agents saw, fleet-wide: every POST's
// outcome, the latency of the accepted ones, and the IDs of the findings the
// controller acknowledged (a 2xx to the request that carried them).
type agentStats struct {
	mu  sync.Mutex
	lat []time.Duration // accepted POSTs of the current phase
	// acked is when each acknowledged finding was first acknowledged, by
	// ID, whole run: one entry per finding given to an agent (Nodes/100 a
	// second), about 100 bytes each.
	acked map[string]time.Time

	ok, tooMany, server, client, network atomic.Int64 // POST outcomes, whole run
	// noConn are the POSTs of network that spent most of their time
	// without a connection: waiting in the harness's bounded transport
	// (agentConnsPerReplica) or connecting (a POST handed a connection
	// just before its timeout counts here too); the rest of network spent
	// most of their time sent, on a connection, unanswered.
	noConn  atomic.Int64
	firstOK atomic.Int64 // agents with at least one accepted report
	// clientErrors are the first answers with a 4xx other than 429 (status
	// and body), so a run that saw some can say which.
	clientErrors []string
}

func newAgentStats() *agentStats {
	return &agentStats{acked: map[string]time.Time{}}
}

// counts is a snapshot of the POST outcome counters.
type counts struct{ ok, tooMany, server, client, network, noConn int64 }

func (s *agentStats) counts() counts {
	return counts{s.ok.Load(), s.tooMany.Load(), s.server.Load(), s.client.Load(), s.network.Load(), s.noConn.Load()}
}

func (c counts) sub(o counts) counts {
	return counts{c.ok - o.ok, c.tooMany - o.tooMany, c.server - o.server, c.client - o.client, c.network - o.network, c.noConn - o.noConn}
}

// takeLatencies returns the accepted POSTs' latencies since the last call,
// sorted, and starts a new phase.
func (s *agentStats) takeLatencies() []time.Duration {
	s.mu.Lock()
	l := s.lat
	s.lat = nil
	s.mu.Unlock()
	slices.Sort(l)
	return l
}

func (s *agentStats) ackedIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.acked))
	for id := range s.acked {
		out = append(out, id)
	}
	return out
}

func (s *agentStats) ackTime(id string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.acked[id]
	return t, ok
}

func (s *agentStats) ackedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.acked)
}

// agentTransport is one simulated agent's HTTP transport, under the real
// agent's uplink (agent/uplink): it sends each POST to the agent's current
// controller replica, moves to the next replica when the current one cannot
// be reached (a Service would do the same), and records the outcome. The
// uplink itself does the batching, the retries with backoff and jitter,
// Retry-After, and keeps every unacknowledged finding queued.
type agentTransport struct {
	base  http.RoundTripper
	urls  []*url.URL
	cur   atomic.Int32
	st    *agentStats
	first atomic.Bool // this agent had a report accepted
	// dead makes every POST fail at once, unsent and uncounted: the agent
	// was killed (the fault suite), its process is gone.
	dead atomic.Bool
}

// errAgentDead is the error of a dead agent's POSTs.
var errAgentDead = errors.New("agent process killed")

func (t *agentTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.dead.Load() {
		return nil, errAgentDead
	}
	i := int(t.cur.Load())
	u := t.urls[i%len(t.urls)]
	// connWait tells a POST that waited for a connection (the harness's
	// own bound) or could not connect from one the controller left
	// unanswered: how long it took to get one, in ns; 0 while it has none.
	var connWait atomic.Int64
	start := time.Now()
	ctx := httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { connWait.Store(max(1, int64(time.Since(start)))) }})
	// A shallow copy with its own URL: the uplink's headers and body are
	// sent as they are, and the body is read again (GetBody) only when the
	// controller accepted it, for the acknowledged IDs: one header clone
	// and one body copy fewer per attempt (http.Client.send clones the
	// headers already), 7.3 -> 6.9 KB and 81 -> 78 allocations per POST in
	// BenchmarkAgentTransport (docs/scale.md, "The harness at 100,000
	// agents (session 7)").
	r := req.WithContext(ctx)
	to := *req.URL
	to.Scheme, to.Host = u.Scheme, u.Host
	r.URL, r.Host = &to, u.Host
	var body []byte
	if req.Body != nil && req.GetBody == nil { // not readable twice: keep a copy
		b, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		body = b
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	}
	resp, err := t.base.RoundTrip(r)
	if err != nil {
		t.st.network.Add(1)
		if w := connWait.Load(); w == 0 || 2*w > int64(time.Since(start)) {
			t.st.noConn.Add(1)
		}
		if len(t.urls) > 1 {
			t.cur.CompareAndSwap(int32(i), int32((i+1)%len(t.urls)))
		}
		return nil, err
	}
	d := time.Since(start)
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		t.st.ok.Add(1)
		if body == nil && req.GetBody != nil {
			if rc, err := req.GetBody(); err == nil {
				body, _ = io.ReadAll(rc)
				rc.Close()
			}
		}
		if !t.first.Swap(true) {
			t.st.firstOK.Add(1)
		}
		var ids []string
		if !bytes.Contains(body, []byte(`"findings":[]`)) {
			var rep struct {
				Findings []struct {
					ID string `json:"id"`
				} `json:"findings"`
			}
			if json.Unmarshal(body, &rep) == nil {
				for _, f := range rep.Findings {
					ids = append(ids, f.ID)
				}
			}
		}
		now := time.Now()
		t.st.mu.Lock()
		t.st.lat = append(t.st.lat, d)
		for _, id := range ids {
			if _, ok := t.st.acked[id]; !ok {
				t.st.acked[id] = now
			}
		}
		t.st.mu.Unlock()
	case c == http.StatusTooManyRequests:
		t.st.tooMany.Add(1)
	case c >= 500:
		t.st.server.Add(1)
	default:
		t.st.client.Add(1)
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(b))
		t.st.mu.Lock()
		if len(t.st.clientErrors) < 10 {
			t.st.clientErrors = append(t.st.clientErrors, fmt.Sprintf("%s %s: %s", time.Now().UTC().Format(time.TimeOnly), resp.Status, bytes.TrimSpace(b)))
		}
		t.st.mu.Unlock()
	}
	return resp, nil
}

// countingTransport counts the harness's own requests to the API server, so
// they can be taken out of apiserver_request_total.
type countingTransport struct {
	base http.RoundTripper
	n    *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.base.RoundTrip(r)
}
