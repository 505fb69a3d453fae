package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/shadow"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
)

var shadowNow = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// shadowServer serves the API with fn as the shadow report (nil: none).
func shadowServer(t *testing.T, st *store.Store, fn func(ctx context.Context, since, until time.Time) (any, error)) *httptest.Server {
	t.Helper()
	ops, err := auth.NewOperators([]auth.Operator{
		{Name: "viewer", Role: auth.RoleViewer, TokenSHA256: auth.TokenHash(viewerToken)},
		{Name: "viewer2", Role: auth.RoleViewer, TokenSHA256: auth.TokenHash(viewerToken + "2")},
		{Name: "viewer3", Role: auth.RoleViewer, TokenSHA256: auth.TokenHash(viewerToken + "3")}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := api.Handler(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"}, Shadow: fn, Operators: ops,
		Now: func() time.Time { return shadowNow }, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

const viewerToken = "viewer-token"

func getShadow(t *testing.T, srv *httptest.Server, q url.Values) (int, []byte) {
	t.Helper()
	code, b, _ := getShadowAs(srv, viewerToken, q)
	return code, b
}

// getShadowAs GETs the shadow report with an operator token ("" for none).
func getShadowAs(srv *httptest.Server, token string, q url.Values) (int, []byte, http.Header) {
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/v1/shadow?"+q.Encode(), nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, []byte(err.Error()), nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header
}

// TestShadowNeedsViewer: the shadow report, the API's most expensive answer,
// is never computed for an anonymous caller (issue 11: one anonymous GET took
// the controller from 48 to 667 MB).
func TestShadowNeedsViewer(t *testing.T) {
	t.Parallel()
	st := pgtest.Store(t)
	var calls atomic.Int32
	srv := shadowServer(t, st, func(context.Context, time.Time, time.Time) (any, error) { calls.Add(1); return &shadow.Report{}, nil })
	q := url.Values{"since": {shadowNow.Add(-time.Hour).Format(time.RFC3339)}}
	for _, tok := range []string{"", "wrong"} {
		if code, body, _ := getShadowAs(srv, tok, q); code != http.StatusUnauthorized {
			t.Errorf("token %q: %d %s, want 401", tok, code, body)
		}
	}
	if calls.Load() != 0 {
		t.Fatalf("the report ran %d times for unauthenticated callers", calls.Load())
	}
}

// TestShadowConcurrencyLimit sends six concurrent shadow requests (the
// issue's 4.0 GB case): at most Limits.ShadowConcurrent reports run at once,
// one per operator; the others are answered 429 with Retry-After at once.
func TestShadowConcurrencyLimit(t *testing.T) {
	t.Parallel()
	st := pgtest.Store(t)
	var running, peak atomic.Int32
	started, unblock := make(chan struct{}, 6), make(chan struct{})
	srv := shadowServer(t, st, func(context.Context, time.Time, time.Time) (any, error) {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		started <- struct{}{}
		<-unblock
		running.Add(-1)
		return &shadow.Report{}, nil
	})
	q := url.Values{"since": {shadowNow.Add(-time.Hour).Format(time.RFC3339)}}
	tokens := []string{viewerToken, viewerToken, viewerToken + "2", viewerToken + "2", viewerToken + "3", viewerToken + "3"}
	type answer struct {
		code  int
		retry string
	}
	answers := make(chan answer, len(tokens))
	var wg sync.WaitGroup
	for _, tok := range tokens {
		wg.Go(func() {
			code, _, h := getShadowAs(srv, tok, q)
			answers <- answer{code, h.Get("Retry-After")}
		})
	}
	// The refused ones answer while the admitted ones still run.
	refused := 0
	for refused < len(tokens)-api.DefaultShadowConcurrent {
		a := <-answers
		if a.code != http.StatusTooManyRequests || a.retry == "" {
			t.Fatalf("a request beyond the limit got %d (Retry-After %q), want 429 with Retry-After", a.code, a.retry)
		}
		refused++
	}
	<-started
	<-started
	close(unblock)
	wg.Wait()
	close(answers)
	for a := range answers {
		if a.code != http.StatusOK {
			t.Errorf("an admitted report answered %d", a.code)
		}
	}
	if p := peak.Load(); p != api.DefaultShadowConcurrent {
		t.Fatalf("peak concurrent reports = %d, want %d", p, api.DefaultShadowConcurrent)
	}
}

func TestShadowRange(t *testing.T) {
	t.Parallel()
	st := pgtest.Store(t)
	type call struct{ since, until time.Time }
	var calls []call
	srv := shadowServer(t, st, func(_ context.Context, since, until time.Time) (any, error) {
		calls = append(calls, call{since, until})
		if until.Sub(since) > 31*24*time.Hour {
			return nil, fmt.Errorf("shadow report: range %s is longer than the maximum 744h0m0s: %w", until.Sub(since), store.ErrInvalid)
		}
		return &shadow.Report{Since: since, Until: until}, nil
	})
	week := shadowNow.Add(-168 * time.Hour).Format(time.RFC3339)

	for _, tt := range []struct {
		name  string
		q     url.Values
		want  string // in the error's validations or detail
		calls int    // calls of the report expected
	}{
		{"since missing", url.Values{}, "since: required", 0},
		{"since not a time", url.Values{"since": {"last tuesday"}}, "since: parse time", 0},
		{"since a duration", url.Values{"since": {"168h"}}, `"168h" is a duration`, 0},
		{"until not a time", url.Values{"since": {week}, "until": {"soon"}}, "until: parse time", 0},
		{"since after until", url.Values{"since": {week}, "until": {shadowNow.Add(-200 * time.Hour).Format(time.RFC3339)}}, "must be before until", 0},
		{"empty range", url.Values{"since": {week}, "until": {week}}, "must be before until", 0},
		{"since in the future", url.Values{"since": {shadowNow.Add(time.Hour).Format(time.RFC3339)}}, "must be before until", 0},
		{"longer than the report allows", url.Values{"since": {shadowNow.Add(-40 * 24 * time.Hour).Format(time.RFC3339)}}, "longer than the maximum", 1},
	} {
		calls = nil
		code, body := getShadow(t, srv, tt.q)
		var eb api.ErrorBody
		if err := json.Unmarshal(body, &eb); err != nil {
			t.Fatalf("%s: decode %s: %v", tt.name, body, err)
		}
		text := eb.Detail + " " + strings.Join(eb.Validations, "; ")
		if code != http.StatusBadRequest || eb.Message != "invalid range" || !strings.Contains(text, tt.want) || len(calls) != tt.calls {
			t.Errorf("%s: %d %+v, %d report calls; want 400 invalid range saying %q, %d calls", tt.name, code, eb, len(calls), tt.want, tt.calls)
		}
	}

	// until defaults to now, and a future until is clamped to now.
	for _, q := range []url.Values{{"since": {week}}, {"since": {week}, "until": {shadowNow.Add(48 * time.Hour).Format(time.RFC3339)}}} {
		calls = nil
		code, body := getShadow(t, srv, q)
		if code != http.StatusOK || len(calls) != 1 || !calls[0].until.Equal(shadowNow) || !calls[0].since.Equal(shadowNow.Add(-168*time.Hour)) {
			t.Errorf("%v: %d %s, calls %+v; want 200 and one call for [now-168h, now)", q, code, body, calls)
		}
	}
}

func TestShadowNotConfigured(t *testing.T) {
	t.Parallel()
	st := pgtest.Store(t)
	code, _ := getShadow(t, shadowServer(t, st, nil), url.Values{"since": {shadowNow.Add(-time.Hour).Format(time.RFC3339)}})
	if code != http.StatusNotImplemented {
		t.Errorf("without a shadow report: %d, want 501", code)
	}
}

// TestShadowReport wires the real report, as cmd/runner does, on an
// empty fleet: the body is a shadow.Report with empty lists, not nulls.
func TestShadowReport(t *testing.T) {
	t.Parallel()
	st := pgtest.Store(t)
	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := shadowServer(t, st, shadow.Config{Store: st, Engine: eng}.ReportFunc())
	code, body := getShadow(t, srv, url.Values{"since": {shadowNow.Add(-24 * time.Hour).Format(time.RFC3339)}})
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	for _, key := range []string{`"deletions": []`, `"approvalsNeeded": []`, `"trips": []`, `"byReason": {}`, `"until": "2026-11-30T12:00:00Z"`} {
		if !strings.Contains(string(body), key) {
			t.Errorf("body lacks %s:\n%s", key, body)
		}
	}
}
