package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/go-chi/chi/v5"

	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/web/api"
)

// loadOpenAPI loads and validates the served document (GET /api/v1/openapi.json's body).
func loadOpenAPI() (*openapi3.T, error) {
	b, err := api.OpenAPI()
	if err != nil {
		return nil, err
	}
	doc, err := openapi3.NewLoader().LoadFromData(b)
	if err != nil {
		return nil, fmt.Errorf("load openapi document: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("validate openapi document: %w", err)
	}
	return doc, nil
}

// TestOpenAPIMatchesRouter: every route of the router (method and path) is
// an operation of the document, and every operation of the document is
// routed; the document is valid OpenAPI 3 and served as JSON.
func TestOpenAPIMatchesRouter(t *testing.T) {
	doc, err := loadOpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	h, err := api.Handler(api.Config{Store: e.st, Catalog: catalog.Default()})
	if err != nil {
		t.Fatal(err)
	}
	routes, ok := h.(chi.Routes)
	if !ok {
		t.Fatalf("the handler is a %T, not a chi router", h)
	}
	routed := map[string]bool{}
	if err := chi.Walk(routes, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		routed[method+" "+strings.TrimSuffix(route, "/")] = true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented[method+" "+path] = true
		}
	}
	var missing, extra []string
	for k := range routed {
		if !documented[k] {
			missing = append(missing, k)
		}
	}
	for k := range documented {
		if !routed[k] {
			extra = append(extra, k)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 {
		t.Errorf("routes missing from web/api/openapi.yaml: %v", missing)
	}
	if len(extra) > 0 {
		t.Errorf("operations of web/api/openapi.yaml that no route serves: %v", extra)
	}
	if len(routed) < 20 {
		t.Errorf("walked only %d routes: %v", len(routed), routed)
	}

	var served map[string]any
	if code := getJSON(t, e.srv.URL+"/api/v1/openapi.json", &served); code != http.StatusOK || served["openapi"] != "3.0.3" {
		t.Fatalf("GET /api/v1/openapi.json: %d, openapi=%v", code, served["openapi"])
	}
}

// responseCheck validates every response the API tests receive through
// http.DefaultTransport against the document (TestMain installs it): a
// response whose status or body the document does not describe fails the
// request with an error naming the operation and the mismatch.
type responseCheck struct {
	next   http.RoundTripper
	router routers.Router

	mu      sync.Mutex
	checked map[string]int // operationId -> responses validated
}

func newResponseCheck(next http.RoundTripper) (*responseCheck, error) {
	doc, err := loadOpenAPI()
	if err != nil {
		return nil, err
	}
	doc.Servers = nil // match any host: the test servers listen on random ports
	r, err := legacy.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("new openapi router: %w", err)
	}
	return &responseCheck{next: next, router: r, checked: map[string]int{}}, nil
}

func (c *responseCheck) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(req)
	if err != nil || !strings.HasPrefix(req.URL.Path, "/api/v1/") && req.URL.Path != "/livez" && req.URL.Path != "/readyz" && req.URL.Path != "/metrics" {
		return resp, err
	}
	route, params, ferr := c.router.FindRoute(req)
	if ferr != nil {
		if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
			return resp, nil // the tests of unknown routes and methods
		}
		resp.Body.Close()
		return nil, fmt.Errorf("openapi: %s %s answered %d but is not in web/api/openapi.yaml: %w", req.Method, req.URL.Path, resp.StatusCode, ferr)
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		// A stream: its body never ends; the status and type are documented
		// (FindRoute above), the events are the SSE tests' business.
		if resp.StatusCode != http.StatusOK || route.Operation.Responses.Status(http.StatusOK) == nil {
			resp.Body.Close()
			return nil, fmt.Errorf("openapi: %s %s streams with status %d, which web/api/openapi.yaml does not describe", req.Method, req.URL.Path, resp.StatusCode)
		}
		c.mu.Lock()
		c.checked[route.Operation.OperationID]++
		c.mu.Unlock()
		return resp, nil
	}
	body, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	if rerr != nil {
		return nil, rerr
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}},
		Status: resp.StatusCode, Header: resp.Header, Body: io.NopCloser(bytes.NewReader(body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	if verr := openapi3filter.ValidateResponse(req.Context(), in); verr != nil {
		return nil, fmt.Errorf("openapi: %s %s answered %d, which web/api/openapi.yaml does not describe: %v\nbody: %.2000s",
			req.Method, req.URL.Path, resp.StatusCode, verr, body)
	}
	c.mu.Lock()
	c.checked[route.Operation.OperationID]++
	c.mu.Unlock()
	return resp, nil
}

var respCheck *responseCheck

func TestMain(m *testing.M) {
	c, err := newResponseCheck(http.DefaultTransport)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	respCheck = c
	http.DefaultTransport = c
	os.Exit(runTests(m))
}

// TestOpenAPIResponses calls every read of the API on a seeded fleet (and
// the commands, as operators) so each operation's answer is validated by
// responseCheck at least once, whichever other tests run.
func TestOpenAPIResponses(t *testing.T) {
	e, srv := opsEnv(t)
	seedFleet(t, e.st)
	before := map[string]int{}
	respCheck.mu.Lock()
	for k, v := range respCheck.checked {
		before[k] = v
	}
	respCheck.mu.Unlock()

	for _, path := range []string{"/livez", "/readyz", "/metrics", "/api/v1/openapi.json", "/api/v1/repairs?limit=1", "/api/v1/repairs?limit=0",
		"/api/v1/repairs/1", "/api/v1/repairs/999", "/api/v1/nodes?limit=2", "/api/v1/nodes/c1/n1", "/api/v1/fleet", "/api/v1/approvals",
		"/api/v1/stats?days=3", "/api/v1/reasons", "/api/v1/clusters", "/api/v1/breakers", "/api/v1/shadow?since=2026-01-01T00:00:00Z", "/api/v1/events",
		"/api/v1/clusters/c1/nodeclaims?state=stuck"} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer viewer-token") // reads may need a viewer
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		resp.Body.Close()
	}
	for _, c := range []struct{ path, token, body string }{
		{"/api/v1/reports", "", report("n1", xid("openapi-1", 79))},
		{"/api/v1/repairs/1/reject", "approver-token", `{"reason":"checked by hand"}`},
		{"/api/v1/repairs/1/approve", "approver-token", `{"reason":"again"}`}, // 409: no longer held
		{"/api/v1/breakers/kill-switch", "admin-token", `{"on":true,"reason":"drill"}`},
		{"/api/v1/breakers/resume", "admin-token", `{"cohort":"zone=z1","reason":"not open"}`},
		{"/api/v1/job-reports", "approver-token", `{"schemaVersion":"v1","cluster":"c1","job":{"id":"slurm/1","source":"slurm"},"failures":[]}`},
	} {
		code, body := postAs(t, srv.URL+c.path, c.token, c.body)
		if code == 0 {
			t.Fatalf("POST %s: %s", c.path, body)
		}
	}
	var kill json.RawMessage
	_ = getJSON(t, srv.URL+"/api/v1/breakers", &kill)

	doc, err := loadOpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	respCheck.mu.Lock()
	defer respCheck.mu.Unlock()
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if respCheck.checked[op.OperationID] <= before[op.OperationID] {
				t.Errorf("%s %s (%s): no response validated against the document", method, path, op.OperationID)
			}
		}
	}
}
