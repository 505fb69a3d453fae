package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/shadow"
	"github.com/fleetrepair/fleetrepair/web/api"
)

func TestShadowCommand(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 30, 12, 40, 0, 0, time.UTC)
	canned := shadow.Report{Since: at.Add(-168 * time.Hour), Until: at, Nodes: 50, Findings: 6,
		Deletions: []shadow.Deletion{{Cluster: "c1", Node: "n-lost", NodePool: "train", Reason: "GPULost", At: at}},
		ApprovalsNeeded: []shadow.Approval{{Cluster: "c1", Node: "z1-00", Reason: "GPULost", Why: shadow.WhyBreaker,
			Action: "replace", At: at, Outcome: shadow.OutcomePending}},
		Trips: []shadow.Trip{{Cohort: "zone=z1", Scope: "cohort", At: at.Add(-10 * time.Minute),
			Evidence: breaker.Evidence{CohortNodes: 10, CohortFailing: 4, RestNodes: 40, Log10P: -3.04}}},
		ByReason: map[string]*shadow.ReasonCounts{"GPULost": {Repairs: 2, Deletions: 1, ApprovalsNeeded: 1, HeldByBreaker: 1}},
		Notes:    []string{"1 finding(s) have no observation time"}}
	var queries []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		queries = append(queries, r.URL.RawQuery)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path != "/api/v1/shadow" {
			http.NotFound(w, r)
			return
		}
		if r.URL.Query().Get("until") == "2000-01-01T00:00:00Z" {
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(api.ErrorBody{Message: "invalid range", Validations: []string{"since: must be before until"}})
			return
		}
		_ = json.NewEncoder(w).Encode(canned)
	}))
	t.Cleanup(srv.Close)

	shadowRun := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{"shadow", "--server", srv.URL}, args...), strings.NewReader(""), &out, &errOut)
		return out.String(), err
	}

	before := time.Now()
	out, err := shadowRun("--since", "168h")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"50 nodes, 6 findings", "deleted 1 node(s); asked on-call 1 time(s) (1 held by a breaker, 0 not executable); tripped 1 breaker(s)",
		"zone=z1", "4 of 10", "c1/n-lost", "c1/z1-00", "GPULost", "no observation time"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	// The duration became an RFC 3339 since, and no until was sent.
	q := queries[len(queries)-1]
	since, err := time.Parse(time.RFC3339, strings.TrimPrefix(strings.ReplaceAll(q, "%3A", ":"), "since="))
	if err != nil || since.Before(before.Add(-168*time.Hour-time.Second)) || since.After(time.Now().Add(-168*time.Hour)) || strings.Contains(q, "until") {
		t.Errorf("query %q: want since=now-168h only (%v)", q, err)
	}

	out, err = shadowRun("--since", "2026-11-23T12:00:00Z", "--until", "1d", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got shadow.Report
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.Trips) != 1 || got.Trips[0].Cohort != "zone=z1" {
		t.Errorf("json: %v %+v", err, got)
	}
	if q := queries[len(queries)-1]; !strings.Contains(q, "since=2026-11-23T12%3A00%3A00Z") || !strings.Contains(q, "until=") {
		t.Errorf("query %q: want the given since and an until", q)
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "--since is required"},
		{[]string{"--since", "last week"}, `--since: "last week"`},
		{[]string{"--since", "-5h"}, "--since"},
		{[]string{"--since", "7d", "-o", "wide"}, `--output "wide"`},
		{[]string{"--since", "7d", "--until", "2000-01-01T00:00:00Z"}, "400 Bad Request: invalid range: since: must be before until"},
	} {
		if _, err := shadowRun(tt.args...); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: err %v, want %q", tt.args, err, tt.want)
		}
	}
}
