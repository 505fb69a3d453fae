package api

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/lifecycle"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// Service is the logic behind the routes, shared by the JSON API and the
// dashboard (web/ui): every read returns the type its GET route serves, and
// every command (approve, reject, resume, kill switch) is the one code path
// the route, the CLI (through the route) and a dashboard button all take.
type Service struct{ s *server }

// New validates cfg, registers the API's metrics and returns the service.
func New(cfg Config) (*Service, error) {
	s, err := newServer(cfg)
	if err != nil {
		return nil, err
	}
	return &Service{s: s}, nil
}

// Handler returns the HTTP handler with every route.
func (sv *Service) Handler() http.Handler { return sv.s.routes() }

// Catalog is the reason catalog the service serves.
func (sv *Service) Catalog() *catalog.Catalog { return sv.s.cfg.Catalog }

// Problem is an error a command or read answers with: an HTTP status and the
// error envelope's fields. Store errors are not Problems; StatusOf maps both.
type Problem struct {
	Status      int
	Message     string
	Detail      string
	Validations []string
	// RetryAfter, when set, is sent as Retry-After (whole seconds, at
	// least 1): a 429 or 503 the caller may retry.
	RetryAfter time.Duration
}

func (p *Problem) Error() string {
	s := p.Message
	if p.Detail != "" {
		s += ": " + p.Detail
	}
	if len(p.Validations) > 0 {
		s += " (" + strings.Join(p.Validations, "; ") + ")"
	}
	return s
}

// StatusOf returns the HTTP status for an error of the service: a Problem's
// own, 404/409/400 for the store's ErrNotFound/ErrConflict/ErrInvalid, 500
// otherwise.
func StatusOf(err error) int {
	var p *Problem
	switch {
	case errors.As(err, &p):
		return p.Status
	case errors.Is(err, store.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, store.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, store.ErrInvalid):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// writeErr writes a Problem as itself and anything else as writeStoreError does.
func (s *server) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	var p *Problem
	if errors.As(err, &p) {
		if p.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(max(int((p.RetryAfter+time.Second-1)/time.Second), 1)))
		}
		writeError(w, p.Status, p.Message, p.Detail, p.Validations)
		return
	}
	s.writeStoreError(w, r, err)
}

func badRequest(msg string, validations ...string) *Problem {
	return &Problem{Status: http.StatusBadRequest, Message: msg, Validations: validations}
}

// RepairDetail returns a repair with its audit and findings (GET /api/v1/repairs/{id}).
func (sv *Service) RepairDetail(ctx context.Context, id int64) (RepairDetail, error) {
	st := sv.s.cfg.Store
	rp, err := st.GetRepair(ctx, id)
	if err != nil {
		return RepairDetail{}, err
	}
	audit, err := st.RepairAudit(ctx, id)
	if err != nil {
		return RepairDetail{}, err
	}
	fs, err := st.RepairFindings(ctx, id)
	if err != nil {
		return RepairDetail{}, err
	}
	out := RepairDetail{Repair: toRepair(rp), Audit: make([]AuditEntry, 0, len(audit)), Findings: fs}
	for _, a := range audit {
		out.Audit = append(out.Audit, toAudit(a))
	}
	if out.Findings == nil {
		out.Findings = []finding.Finding{}
	}
	return out, nil
}

// NodeDetail returns a node's state, health, diagnoses (newest 200),
// findings (newest 500) and repairs (newest 100) (GET /api/v1/nodes/{cluster}/{node}).
func (sv *Service) NodeDetail(ctx context.Context, cluster, name string) (NodeDetail, error) {
	st := sv.s.cfg.Store
	n, err := st.GetNode(ctx, cluster, name)
	if err != nil {
		return NodeDetail{}, err
	}
	ds, err := st.DiagnosesForNode(ctx, cluster, name, 200)
	if err != nil {
		return NodeDetail{}, err
	}
	fs, err := st.FindingsForNode(ctx, cluster, name, time.Time{}, 500)
	if err != nil {
		return NodeDetail{}, err
	}
	rs, _, err := st.ListRepairs(ctx, store.RepairFilter{Cluster: cluster, Node: name, Limit: 100})
	if err != nil {
		return NodeDetail{}, err
	}
	out := NodeDetail{Node: toNode(n), Diagnoses: []Diagnosis{}, Findings: fs, Repairs: []Repair{}}
	out.Health, out.HealthReason = sv.s.health(n, ds)
	if out.Findings == nil {
		out.Findings = []finding.Finding{}
	}
	for _, d := range ds {
		out.Diagnoses = append(out.Diagnoses, toDiagnosis(d))
	}
	for _, rp := range rs {
		out.Repairs = append(out.Repairs, toRepair(rp))
	}
	return out, nil
}

// NodeQuery selects nodes for Nodes (GET /api/v1/nodes): the query
// parameters cluster, nodepool, zone, q (name contains), health (ok,
// failing, unknown, attention = failing or unknown), includeRemoved,
// cursor and limit.
type NodeQuery struct {
	Cluster, NodePool, Zone, Search, Health, Cursor string
	Limit                                           int
	// IncludeRemoved also lists the nodes whose Kubernetes Node is gone
	// (Node.RemovedAt); they are left out by default.
	IncludeRemoved bool
}

// NodeItem is one node of a node listing with its derived health.
type NodeItem struct {
	Node
	// Health is ok, failing or unknown; HealthReason says why.
	Health       string `json:"health"`
	HealthReason string `json:"healthReason"`
	// OpenRepair is the node's open repair, if any.
	OpenRepairID    int64  `json:"openRepairID,omitempty"`
	OpenRepairState string `json:"openRepairState,omitempty"`
}

// NodeList is the body of GET /api/v1/nodes.
type NodeList struct {
	Items []NodeItem `json:"items"`
	// NextCursor continues the listing (?cursor=...); empty on the last page.
	NextCursor string `json:"nextCursor,omitempty"`
}

// Nodes returns one page of nodes by cluster and name, keyset-paginated.
func (sv *Service) Nodes(ctx context.Context, q NodeQuery) (NodeList, error) {
	s := sv.s
	f := store.NodeFilter{Cluster: q.Cluster, NodePool: q.NodePool, Zone: q.Zone, Search: q.Search, Limit: q.Limit,
		IncludeRemoved: q.IncludeRemoved, StaleBefore: s.cfg.Now().Add(-s.staleAfter())}
	var problems []string
	switch q.Health {
	case "":
	case HealthOK:
		f.Health = store.NodeHealthOK
	case HealthFailing:
		f.Health = store.NodeHealthFailing
	case HealthUnknown:
		f.Health = store.NodeHealthSilent
	case "attention":
		f.Health = store.NodeHealthAttention
	default:
		problems = append(problems, fmt.Sprintf("health: %q is not ok, failing, unknown or attention", q.Health))
	}
	if q.Limit < 0 || q.Limit > store.MaxListLimit {
		problems = append(problems, fmt.Sprintf("limit: must be 1..%d", store.MaxListLimit))
	}
	if q.Cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(q.Cursor)
		c, n, ok := strings.Cut(string(b), "\x00")
		if err != nil || !ok || n == "" {
			problems = append(problems, "cursor: not a cursor returned by this API")
		}
		f.AfterCluster, f.AfterName = c, n
	}
	if len(problems) > 0 {
		return NodeList{}, badRequest("invalid query", problems...)
	}
	rows, more, err := s.cfg.Store.NodePage(ctx, f)
	if err != nil {
		return NodeList{}, err
	}
	out := NodeList{Items: make([]NodeItem, 0, len(rows))}
	for _, r := range rows {
		it := NodeItem{Node: toNode(r.Node), OpenRepairID: r.OpenRepairID, OpenRepairState: r.OpenRepair}
		var ds []store.DiagnosisRecord
		if r.ActiveReason != "" {
			ds = []store.DiagnosisRecord{{Reason: r.ActiveReason, Severity: "condition", Active: true}}
		}
		it.Health, it.HealthReason = s.health(r.Node, ds)
		out.Items = append(out.Items, it)
	}
	if more && len(rows) > 0 {
		last := rows[len(rows)-1]
		out.NextCursor = base64.RawURLEncoding.EncodeToString([]byte(last.Cluster + "\x00" + last.Name))
	}
	// An unreachable cluster makes every node unknown, which the store's
	// filter cannot see: drop what no longer matches.
	if q.Health == HealthOK || q.Health == HealthFailing {
		out.Items = slices.DeleteFunc(out.Items, func(it NodeItem) bool { return it.Health != q.Health })
	}
	return out, nil
}

// Fleet is the body of GET /api/v1/fleet: what the fleet is doing now.
type Fleet struct {
	At       time.Time      `json:"at"`
	Clusters []FleetCluster `json:"clusters"`
	// Breakers is the breaker state: open cohorts with their evidence, the
	// fleet ceiling, the kill switch.
	Breakers breaker.State `json:"breakers"`
	// AwaitingApproval counts repairs held for on-call approval.
	AwaitingApproval int `json:"awaitingApproval"`
	// Deleting are the repairs whose NodeClaim deletion is in flight.
	Deleting []Repair `json:"deleting"`
	// StaleAfterSeconds is the agent silence after which a node's health is unknown.
	StaleAfterSeconds float64 `json:"staleAfterSeconds"`
}

// FleetCluster is one cluster of the fleet.
type FleetCluster struct {
	ClusterState
	// DeletionsPerHour and DeletionsLeft: the cluster's budget and what is
	// left of it in the sliding hour (live repairs; dry-run ones do not spend it).
	DeletionsPerHour         int             `json:"deletionsPerHour"`
	DeletionsLeft            int             `json:"deletionsLeft"`
	NodePoolDeletionsPerHour int             `json:"nodePoolDeletionsPerHour"`
	MaxInFlightPerNodePool   int             `json:"maxInFlightPerNodePool"`
	NodePools                []FleetNodePool `json:"nodePools"`
	Nodes                    int             `json:"nodes"`
	Failing                  int             `json:"failing"`
	Unknown                  int             `json:"unknown"`
	// NodeClaims counts the cluster's NodeClaims by lifecycle state and
	// lists up to MaxFleetStuckClaims stuck ones (GET
	// /api/v1/clusters/{cluster}/nodeclaims has them all); nil before the
	// first periodic pass listed the cluster.
	NodeClaims *NodeClaimList `json:"nodeClaims,omitempty"`
}

// FleetNodePool counts one NodePool's nodes by health and its open repairs.
// When the cluster is unreachable every node counts as unknown.
type FleetNodePool struct {
	Name             string `json:"name"`
	Nodes            int    `json:"nodes"`
	OK               int    `json:"ok"`
	Failing          int    `json:"failing"`
	Unknown          int    `json:"unknown"`
	Deleting         int    `json:"deleting"`
	AwaitingApproval int    `json:"awaitingApproval"`
	OpenRepairs      int    `json:"openRepairs"`
}

func (s *server) clusterStates() []ClusterState {
	if s.cfg.ClusterStates != nil {
		return s.cfg.ClusterStates()
	}
	out := make([]ClusterState, 0, len(s.cfg.Clusters))
	for _, c := range s.cfg.Clusters {
		out = append(out, ClusterState{Name: c, Reachable: true})
	}
	return out
}

// Fleet returns every served cluster with its NodePools' health counts and
// budgets, the breaker state, the approval backlog and deletions in flight.
func (sv *Service) Fleet(ctx context.Context) (Fleet, error) {
	s := sv.s
	now := s.cfg.Now()
	sum, err := s.cfg.Store.FleetSummary(ctx, now.Add(-s.staleAfter()))
	if err != nil {
		return Fleet{}, err
	}
	budgets, err := s.cfg.Store.BudgetUsages(ctx, now)
	if err != nil {
		return Fleet{}, err
	}
	bs, _, err := s.loadBreakers(ctx)
	if err != nil {
		return Fleet{}, err
	}
	out := Fleet{At: now, Breakers: bs, Deleting: []Repair{}, StaleAfterSeconds: s.staleAfter().Seconds()}
	for _, cs := range s.clusterStates() {
		fc := FleetCluster{ClusterState: cs, NodePools: []FleetNodePool{}}
		for _, b := range budgets {
			if b.Cluster == cs.Name {
				fc.DeletionsPerHour, fc.DeletionsLeft = b.DeletionsPerHour, b.Left()
				fc.NodePoolDeletionsPerHour, fc.MaxInFlightPerNodePool = b.NodePoolDeletionsPerHour, b.MaxInFlightPerNodePool
			}
		}
		for _, p := range sum {
			if p.Cluster != cs.Name {
				continue
			}
			np := FleetNodePool{Name: p.NodePool, Nodes: p.Nodes, OK: p.OK, Failing: p.Failing, Unknown: p.Silent,
				Deleting: p.Deleting, AwaitingApproval: p.Held, OpenRepairs: p.Open}
			if !cs.Reachable {
				np.OK, np.Failing, np.Unknown = 0, 0, p.Nodes
			}
			fc.Nodes, fc.Failing, fc.Unknown = fc.Nodes+np.Nodes, fc.Failing+np.Failing, fc.Unknown+np.Unknown
			out.AwaitingApproval += np.AwaitingApproval
			fc.NodePools = append(fc.NodePools, np)
		}
		if claims, at, ok := s.nodeClaimStates(cs.Name); ok {
			l := nodeClaimList(cs.Name, claims, at, func(c lifecycle.Claim) bool { return c.Stuck })
			l.Items = l.Items[:min(len(l.Items), MaxFleetStuckClaims)]
			fc.NodeClaims = &l
		}
		out.Clusters = append(out.Clusters, fc)
	}
	dl, _, err := s.cfg.Store.ListRepairs(ctx, store.RepairFilter{State: ledger.Deleting, Limit: store.MaxListLimit})
	if err != nil {
		return Fleet{}, err
	}
	for _, rp := range dl {
		out.Deleting = append(out.Deleting, toRepair(rp))
	}
	return out, nil
}

// Approvals is the body of GET /api/v1/approvals: the repairs awaiting
// on-call approval, grouped by what holds them.
type Approvals struct {
	Total  int             `json:"total"`
	Groups []ApprovalGroup `json:"groups"`
	// More is true when there are more held repairs than MaxListLimit; the
	// oldest are listed.
	More bool `json:"more,omitempty"`
}

// ApprovalGroup is held repairs with one cause: HeldBy is "breaker" (Cohort
// names the open breaker, Breaker its evidence), "action" (the recommended
// action is not executable here, decision 6b) or "other".
type ApprovalGroup struct {
	HeldBy      string           `json:"heldBy"`
	Cohort      string           `json:"cohort,omitempty"`
	Breaker     *breaker.Breaker `json:"breaker,omitempty"`
	Explanation string           `json:"explanation"`
	Repairs     []HeldRepair     `json:"repairs"`
}

// HeldRepair is a repair awaiting approval with its age and expiry.
type HeldRepair struct {
	Repair
	// HeldSince is when it last entered awaiting_approval (the audit);
	// ExpiresAt when the reconciler expires it without a decision
	// (ApprovalTTL after its last update).
	HeldSince time.Time `json:"heldSince"`
	ExpiresAt time.Time `json:"expiresAt"`
}

func (s *server) approvalTTL() time.Duration {
	if s.cfg.ApprovalTTL > 0 {
		return s.cfg.ApprovalTTL
	}
	return 24 * time.Hour
}

// Approvals returns the held repairs grouped by cause, oldest first in
// each group; breaker groups first, by cohort.
func (sv *Service) Approvals(ctx context.Context) (Approvals, error) {
	s := sv.s
	rs, err := s.cfg.Store.RepairsInState(ctx, ledger.AwaitingApproval)
	if err != nil {
		return Approvals{}, err
	}
	bs, _, err := s.loadBreakers(ctx)
	if err != nil {
		return Approvals{}, err
	}
	out := Approvals{Total: len(rs), Groups: []ApprovalGroup{}}
	if len(rs) > store.MaxListLimit {
		rs, out.More = rs[:store.MaxListLimit], true
	}
	ids := make([]int64, len(rs))
	for i, rp := range rs {
		ids[i] = rp.ID
	}
	since, err := s.cfg.Store.HeldSince(ctx, ids)
	if err != nil {
		return Approvals{}, err
	}
	nodes := map[string]store.Node{}
	groups := map[string]*ApprovalGroup{}
	var order []string
	for _, rp := range rs {
		g := sv.holder(ctx, bs, rp, nodes)
		key := g.HeldBy + "\x00" + g.Cohort
		if groups[key] == nil {
			groups[key] = &g
			order = append(order, key)
		}
		held, ok := since[rp.ID]
		if !ok {
			held = rp.UpdatedAt
		}
		// The reconciler expires a held repair ApprovalTTL after its last update.
		groups[key].Repairs = append(groups[key].Repairs, HeldRepair{Repair: toRepair(rp), HeldSince: held,
			ExpiresAt: rp.UpdatedAt.Add(s.approvalTTL())})
	}
	slices.SortStableFunc(order, func(a, b string) int {
		ra, rb := !strings.HasPrefix(a, "breaker\x00"), !strings.HasPrefix(b, "breaker\x00")
		if ra != rb {
			if ra {
				return 1
			}
			return -1
		}
		return strings.Compare(a, b)
	})
	for _, k := range order {
		out.Groups = append(out.Groups, *groups[k])
	}
	return out, nil
}

// holder finds what holds a repair: the open breaker whose evidence lists
// the node (else whose cohort the node belongs to), the ceiling, the action.
func (sv *Service) holder(ctx context.Context, bs breaker.State, rp store.Repair, nodes map[string]store.Node) ApprovalGroup {
	held, _ := rp.Detail["held_by"].(string)
	if held == "action" {
		return ApprovalGroup{HeldBy: "action", Explanation: "the recommended action (reset or reboot) is not executable here: approving replaces the node's NodeClaim"}
	}
	if held != "breaker" {
		return ApprovalGroup{HeldBy: "other", Explanation: "held for on-call approval; see each repair's audit"}
	}
	name := rp.Cluster + "/" + rp.Node
	for _, c := range bs.OpenCohorts() {
		b := bs.Cohorts[c]
		if slices.Contains(b.Evidence.Failing, name) {
			return ApprovalGroup{HeldBy: "breaker", Cohort: c, Breaker: &b, Explanation: ExplainBreaker(b)}
		}
	}
	key := rp.Cluster + "\x00" + rp.Node
	n, ok := nodes[key]
	if !ok {
		n, _ = sv.s.cfg.Store.GetNode(ctx, rp.Cluster, rp.Node)
		nodes[key] = n
	}
	attrs := map[string]string{"cluster": rp.Cluster, "nodepool": rp.NodePool, "zone": n.Zone, "instance_type": n.InstanceType,
		"driver_version": n.DriverVersion, "kernel": n.KernelVersion}
	for _, c := range bs.OpenCohorts() {
		if k, v, ok := strings.Cut(c, "="); ok && attrs[k] == v {
			b := bs.Cohorts[c]
			return ApprovalGroup{HeldBy: "breaker", Cohort: c, Breaker: &b, Explanation: ExplainBreaker(b)}
		}
	}
	if bs.Ceiling != nil {
		b := *bs.Ceiling
		return ApprovalGroup{HeldBy: "breaker", Cohort: breaker.FleetScope, Breaker: &b, Explanation: ExplainBreaker(b)}
	}
	return ApprovalGroup{HeldBy: "breaker", Explanation: "held by a breaker that has since closed: the backlog drains at a paced rate, or approve it now"}
}

// ExplainBreaker says a breaker's evidence in words and numbers, e.g. "7 of 8
// nodes in zone=us-east-1c failing vs 1 of 20 elsewhere, p=10^-4.3, window 10m".
func ExplainBreaker(b breaker.Breaker) string {
	e := b.Evidence
	win := time.Duration(e.WindowSeconds * float64(time.Second)).Round(time.Second)
	if b.Scope == breaker.ScopeFleet || b.Cohort == breaker.FleetScope {
		return fmt.Sprintf("%d of %d nodes of the fleet failing (ceiling %d), window %s", e.FleetFailing, e.FleetNodes, e.CeilingNodes, win)
	}
	s := fmt.Sprintf("%d of %d nodes in %s failing vs %d of %d elsewhere", e.CohortFailing, e.CohortNodes, b.Cohort, e.RestFailing, e.RestNodes)
	if e.PValue > 0 {
		s += fmt.Sprintf(", p=%s", pValue(e.PValue))
	}
	return s + fmt.Sprintf(", window %s", win)
}
