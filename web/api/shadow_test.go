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
	"testing"
	"time"

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
	h, err := api.Handler(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"}, Shadow: fn,
		Now: func() time.Time { return shadowNow }, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func getShadow(t *testing.T, srv *httptest.Server, q url.Values) (int, []byte) {
	t.Helper()
	resp, err := http.Get(srv.URL + "/api/v1/shadow?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func TestShadowRange(t *testing.T) {
	t.Parallel()
	st, err := store.Open(context.Background(), pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	type call struct{ since, until time.Time }
	var calls []call
	srv := shadowServer(t, st, func(_ context.Context, since, until time.Time) (any, error) {
		calls = append(calls, call{since, until})
		if until.Sub(since) > 31*24*time.Hour {
			return nil, fmt.Errorf("shadow report: range %s is longer than the maximum 744h0m0s: %w", until.Sub(since), store.ErrInvalid)
		}
		return map[string]any{"since": since, "until": until}, nil
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
	st, err := store.Open(context.Background(), pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	code, _ := getShadow(t, shadowServer(t, st, nil), url.Values{"since": {shadowNow.Add(-time.Hour).Format(time.RFC3339)}})
	if code != http.StatusNotImplemented {
		t.Errorf("without a shadow report: %d, want 501", code)
	}
}

// TestShadowReport wires the real report, as controller/runner does, on an
// empty fleet: the body is a shadow.Report with empty lists, not nulls.
func TestShadowReport(t *testing.T) {
	t.Parallel()
	st, err := store.Open(context.Background(), pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
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
