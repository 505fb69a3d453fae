// Package apiclient is the one Go client of the controller's REST API
// (/api/v1), shared by fleetrepair's command-line client and the demo.
//
// The HTTP calls and their types are generated from the API's OpenAPI
// document (web/api/openapi.yaml) by oapi-codegen into oapi/client.gen.go
// (`make generate`; `make verify` fails when it drifted). The schemas name
// the server's own Go types (x-go-type), so a response decodes into the type
// the controller encoded. Client wraps the generated oapi.ClientWithResponses
// with what every caller needs: a bearer token, a timeout per call, a
// bounded response body, and the API's error envelope turned into an error.
package apiclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/shadow"
	"github.com/fleetrepair/fleetrepair/web/api"
	"github.com/fleetrepair/fleetrepair/web/apiclient/oapi"
)

// DefaultTimeout bounds one call, connection to decoded body, unless
// Options.Timeout says otherwise. The shadow report is bounded by its
// caller's context only (it replays a whole range before it answers).
const DefaultTimeout = 30 * time.Second

// MaxBody bounds a response body read (256 MiB: a shadow report of a week
// of a large fleet); a longer body is an error, never a truncated decode.
const MaxBody = 256 << 20

// Options configures New; zero fields take the defaults.
type Options struct {
	// Token is sent as "Authorization: Bearer <token>" when not empty: an
	// operator token for the commands and the shadow report.
	Token string
	// HTTPClient sends the requests (default: a client on
	// http.DefaultTransport). A kubeconfig context's transport goes here.
	HTTPClient *http.Client
	// Timeout bounds each call but the shadow report (default DefaultTimeout).
	Timeout time.Duration
	// Proxied: the server is reached through a proxy that authenticates the
	// caller by Authorization itself and drops it (the Kubernetes API
	// server's service proxy, HTTPClient carrying its credentials); Token
	// then travels in api.TokenHeader only.
	Proxied bool
}

// Client calls one controller's API.
type Client struct {
	gen     *oapi.ClientWithResponses
	timeout time.Duration
}

// New returns a client of the controller at server (a base URL such as
// https://fleetrepair.example.com or http://127.0.0.1:8080; a path prefix,
// as through the Kubernetes API server's service proxy, is kept).
func New(server string, o Options) (*Client, error) {
	if strings.TrimSpace(server) == "" {
		return nil, errors.New("new api client: no server URL")
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	hc := o.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	opts := []oapi.ClientOption{oapi.WithHTTPClient(boundedDoer{hc})}
	if o.Token != "" {
		tok, proxied := o.Token, o.Proxied
		opts = append(opts, oapi.WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
			if proxied {
				req.Header.Set(api.TokenHeader, tok)
			} else {
				req.Header.Set("Authorization", "Bearer "+tok)
			}
			return nil
		}))
	}
	gen, err := oapi.NewClientWithResponses(strings.TrimRight(server, "/"), opts...)
	if err != nil {
		return nil, fmt.Errorf("new api client: %w", err)
	}
	return &Client{gen: gen, timeout: o.Timeout}, nil
}

// boundedDoer reads at most MaxBody of a response body.
type boundedDoer struct{ c *http.Client }

func (d boundedDoer) Do(req *http.Request) (*http.Response, error) {
	resp, err := d.c.Do(req)
	if err != nil {
		return nil, err
	}
	resp.Body = &boundedBody{rc: resp.Body, left: MaxBody}
	return resp, nil
}

type boundedBody struct {
	rc   io.ReadCloser
	left int64
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, fmt.Errorf("read response body: longer than %d bytes", int64(MaxBody))
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *boundedBody) Close() error { return b.rc.Close() }

// response is what every generated ...Response with a JSON 200 and the
// error envelope as default has.
type response[T any] interface {
	GetJSON200() *T
	GetJSONDefault() *api.ErrorBody
	GetBody() []byte
	StatusCode() int
	Status() string
}

// APIError is an answer other than 200: the status and the API's error
// envelope (empty Message when the body was not one).
type APIError struct {
	Method, URL string
	StatusCode  int
	Status      string
	Body        api.ErrorBody
}

func (e *APIError) Error() string {
	s := fmt.Sprintf("%s %s: %s", e.Method, e.URL, e.Status)
	if e.Body.Message != "" {
		s += ": " + e.Body.Message
	}
	if e.Body.Detail != "" {
		s += ": " + e.Body.Detail
	}
	if len(e.Body.Validations) > 0 {
		s += ": " + strings.Join(e.Body.Validations, "; ")
	}
	return s
}

// answer turns a generated call's result into its 200 body or an error.
func answer[T any, R response[T]](r R, err error) (T, error) {
	var zero T
	if err != nil {
		return zero, err // names the method and URL (net/http's *url.Error), or the decode
	}
	if v := r.GetJSON200(); v != nil {
		return *v, nil
	}
	e := &APIError{StatusCode: r.StatusCode(), Status: r.Status()}
	if hr := httpResponse(r); hr != nil && hr.Request != nil {
		e.Method, e.URL = hr.Request.Method, hr.Request.URL.Redacted()
	}
	if eb := r.GetJSONDefault(); eb != nil {
		e.Body = *eb
	} else if b := strings.TrimSpace(string(r.GetBody())); b != "" {
		// Not the API's envelope: a proxy or load balancer in between answered.
		if len(b) > 200 {
			b = b[:200] + "..."
		}
		e.Body.Message = b
	}
	if e.StatusCode == http.StatusOK {
		return zero, fmt.Errorf("%s %s: 200 without a JSON body", e.Method, e.URL)
	}
	return zero, e
}

// httpResponse is the HTTPResponse field every generated response has.
func httpResponse(r any) *http.Response {
	v := reflect.ValueOf(r)
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return nil
	}
	hr, _ := v.FieldByName("HTTPResponse").Interface().(*http.Response)
	return hr
}

func (c *Client) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.timeout)
}

// RepairQuery selects repairs for Repairs; empty fields do not filter.
type RepairQuery struct {
	Cluster, Node, State, Reason string
	Since, Until                 time.Time
	Cursor                       string
	Limit                        int
}

// Repairs returns one page of repairs, newest first (GET /api/v1/repairs).
func (c *Client) Repairs(ctx context.Context, q RepairQuery) (api.RepairPage, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	p := &oapi.ListRepairsParams{Cluster: opt(q.Cluster), Node: opt(q.Node), State: opt(q.State), Reason: opt(q.Reason), Cursor: opt(q.Cursor)}
	if !q.Since.IsZero() {
		t := q.Since.UTC()
		p.Since = &t
	}
	if !q.Until.IsZero() {
		t := q.Until.UTC()
		p.Until = &t
	}
	if q.Limit > 0 {
		p.Limit = &q.Limit
	}
	return answer[api.RepairPage](c.gen.ListRepairsWithResponse(ctx, p))
}

// Repair returns a repair with its audit and findings (GET /api/v1/repairs/{id}).
func (c *Client) Repair(ctx context.Context, id int64) (api.RepairDetail, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	return answer[api.RepairDetail](c.gen.GetRepairWithResponse(ctx, id))
}

// Approve approves repair id with reason (approver token; POST
// /api/v1/repairs/{id}/approve) and returns the repair after it.
func (c *Client) Approve(ctx context.Context, id int64, reason string) (api.Repair, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	return answer[api.Repair](c.gen.ApproveRepairWithResponse(ctx, id, api.DecisionRequest{Reason: reason}))
}

// Reject rejects repair id with reason (approver token; POST
// /api/v1/repairs/{id}/reject) and returns the repair after it.
func (c *Client) Reject(ctx context.Context, id int64, reason string) (api.Repair, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	return answer[api.Repair](c.gen.RejectRepairWithResponse(ctx, id, api.DecisionRequest{Reason: reason}))
}

// Approvals returns the held repairs grouped by what holds them (GET /api/v1/approvals).
func (c *Client) Approvals(ctx context.Context) (api.Approvals, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	return answer[api.Approvals](c.gen.GetApprovalsWithResponse(ctx))
}

// Breakers returns the breaker state and the newest decisions (GET /api/v1/breakers).
func (c *Client) Breakers(ctx context.Context) (api.BreakerView, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	return answer[api.BreakerView](c.gen.GetBreakersWithResponse(ctx))
}

// Resume closes the open breaker of cohort ("zone=us-east-1a", or "fleet")
// with reason (admin token; POST /api/v1/breakers/resume).
func (c *Client) Resume(ctx context.Context, cohort, reason string) (breaker.State, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	return answer[breaker.State](c.gen.ResumeBreakerWithResponse(ctx, api.BreakerRequest{Cohort: cohort, Reason: reason}))
}

// KillSwitch switches every NodeClaim deletion off (on) or back on, with
// reason (admin token; POST /api/v1/breakers/kill-switch).
func (c *Client) KillSwitch(ctx context.Context, on bool, reason string) (breaker.State, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	return answer[breaker.State](c.gen.SetKillSwitchWithResponse(ctx, api.BreakerRequest{On: &on, Reason: reason}))
}

// Fleet returns what the fleet is doing now (GET /api/v1/fleet).
func (c *Client) Fleet(ctx context.Context) (api.Fleet, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	return answer[api.Fleet](c.gen.GetFleetWithResponse(ctx))
}

// Nodes returns one page of nodes (GET /api/v1/nodes); q's Limit 0 takes
// the server's default.
func (c *Client) Nodes(ctx context.Context, q api.NodeQuery) (api.NodeList, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	p := &oapi.ListNodesParams{Cluster: opt(q.Cluster), Nodepool: opt(q.NodePool), Zone: opt(q.Zone), Q: opt(q.Search), Cursor: opt(q.Cursor)}
	if q.Health != "" {
		h := oapi.ListNodesParamsHealth(q.Health)
		p.Health = &h
	}
	if q.Limit > 0 {
		p.Limit = &q.Limit
	}
	if q.IncludeRemoved {
		p.IncludeRemoved = &q.IncludeRemoved
	}
	return answer[api.NodeList](c.gen.ListNodesWithResponse(ctx, p))
}

// Node returns a node's state, health, diagnoses, findings and repairs (GET /api/v1/nodes/{cluster}/{node}).
func (c *Client) Node(ctx context.Context, cluster, node string) (api.NodeDetail, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	return answer[api.NodeDetail](c.gen.GetNodeWithResponse(ctx, cluster, node))
}

// Reasons returns the reason catalog (GET /api/v1/reasons).
func (c *Client) Reasons(ctx context.Context) (catalog.Catalog, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	return answer[catalog.Catalog](c.gen.GetReasonsWithResponse(ctx))
}

// Clusters returns the served clusters' reachability (GET /api/v1/clusters).
func (c *Client) Clusters(ctx context.Context) (api.ClusterList, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	return answer[api.ClusterList](c.gen.ListClustersWithResponse(ctx))
}

// Shadow returns the shadow report of [since, until) (viewer token; GET
// /api/v1/shadow); a zero until is now. Only ctx bounds it.
func (c *Client) Shadow(ctx context.Context, since, until time.Time) (shadow.Report, error) {
	p := &oapi.GetShadowParams{Since: since}
	if !until.IsZero() {
		p.Until = &until
	}
	return answer[shadow.Report](c.gen.GetShadowWithResponse(ctx, p))
}

// Ingest posts an agent report (agent token; POST /api/v1/reports). The
// agent itself uses agent/uplink, which spools and retries; this is for
// tools and tests.
func (c *Client) Ingest(ctx context.Context, rep finding.Report) (api.IngestResponse, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	return answer[api.IngestResponse](c.gen.IngestReportWithResponse(ctx, rep))
}

// JobReport posts a job-failure report (operator token of role reporter,
// approver or admin; POST /api/v1/job-reports).
func (c *Client) JobReport(ctx context.Context, rep finding.JobReport) (api.JobReportResponse, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	return answer[api.JobReportResponse](c.gen.PostJobReportWithResponse(ctx, rep))
}

// NodeClaims returns a cluster's NodeClaims by lifecycle state (viewer
// token; GET /api/v1/clusters/{cluster}/nodeclaims); state "" is all,
// "stuck" the stuck ones, or comma-separated states.
func (c *Client) NodeClaims(ctx context.Context, cluster, state string) (api.NodeClaimList, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	return answer[api.NodeClaimList](c.gen.GetNodeClaimsWithResponse(ctx, cluster, &oapi.GetNodeClaimsParams{State: opt(state)}))
}

func opt(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
