// Package shadow answers "what would the current policy have done?" for a
// past time range [since, until): it replays the findings actually stored in
// PostgreSQL (controller/store) through the real diagnosis rules
// (controller/diagnose), the operator policy (controller/policy), the real
// cohort breakers (controller/breaker) and an in-memory model of the repair
// ledger's rules (controller/repair: toleration, NodeClaim replacement as the
// only executable action, approvals, approval expiry, deletion budgets,
// paced release of breaker-held repairs). The Report lists the NodeClaim
// deletions, the breaker trips with their evidence, the repairs that would
// have needed on-call approval and why, and counts per reason, so a team can
// turn repair on (or stay in dry run) knowing what it would have done.
//
// Why not controller/simulate: a simulate.Scenario names its nodes
// "<prefix><n>", injects findings from YAML-shaped maps (fabricating their
// IDs, boot IDs, evidence and sequence numbers), has one cluster-wide
// deletion budget and no NodeClaim or maxInFlight model, and re-breaks a
// replaced node when the real node's later findings arrive. A replay of
// stored findings needs the findings untouched (the diagnosis rules key
// escalation on boot IDs), cluster-qualified names and per-cluster budgets,
// so this package replays on top of diagnose and breaker directly. It keeps
// the simulator's semantics where both model the same rule and follows
// controller/repair where they differ (docs/shadow.md lists every
// difference).
//
// Run reads the store (ListClusters, ListNodes, FindingsForNodeRange) and is
// otherwise pure: no wall clock, no goroutines outlive it, deterministic for
// a given database content.
package shadow

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/config"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/policy"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// Defaults of Config fields left zero. The first four are the controller
// configuration's defaults (controller/config, the one place they are
// written); the others are this model's assumptions (docs/shadow.md).
const (
	DefaultLookback     = config.DefaultLookback     // findings read per node (repair.Config.Lookback)
	DefaultResync       = config.DefaultResync       // the controller's pass period (repair.Config.Resync)
	DefaultDrainPerPass = config.DefaultDrainPerPass // breaker-held repairs released per pass
	DefaultApprovalTTL  = config.DefaultApprovalTTL  // a repair awaiting approval expires after this
	// DefaultDeletingFor is how long a deletion counts as in flight against
	// max_in_flight_per_nodepool: the ledger's deleting state lasts until the
	// NodeClaim is gone (drain and termination), which the store does not
	// record for repairs that never ran.
	DefaultDeletingFor = config.DefaultDeletingFor
	// DefaultRepeatWindow is diagnose.Options.RepeatWindow's default: the
	// only window over which a diagnosis changes with time alone, so a node
	// is re-diagnosed when one of its findings leaves it.
	DefaultRepeatWindow = time.Hour
	// DefaultMaxRange bounds until - since: the replay holds every finding
	// of the range in memory.
	DefaultMaxRange = 31 * 24 * time.Hour
	// DefaultMaxFindings bounds the findings loaded for one report (range
	// plus lookback, every node; a few hundred bytes each in memory): a
	// larger range is refused, not truncated.
	DefaultMaxFindings = 500_000
	// maxFindingsPerNode bounds one node's findings; beyond it the node's
	// later findings are left out and the report says so in Notes.
	maxFindingsPerNode = 100_000
	// diagnoseLimit is how many findings the controller reads per node and
	// reconcile (the newest: store.FindingsForNode in repair.ReconcileNode).
	diagnoseLimit = 10000
	loadWorkers   = 4
	// throttleFindings: a node is diagnosed again no sooner than one
	// Resync per this many findings its diagnosis read (replay.diagnose).
	throttleFindings = 30
)

// Config is what the replay needs: the store (the source of facts) and the
// policy the controller runs with now. cmd/runner builds it from the
// same values it gives controller/repair.
type Config struct {
	// Store is read: ListClusters (budgets), ListNodes (cohort
	// attributes, NodeClaim), FindingsForNodeRange. Required.
	Store *store.Store
	// Engine is the diagnosis engine. Required.
	Engine *diagnose.Engine
	// Policy holds operator overrides per reason and NodePool (nil: none).
	Policy *policy.Policy
	// Breaker is the cohort breaker policy (nil: breakers off, as in the
	// controller).
	Breaker *breaker.Policy
	// Toleration, when > 0, replaces every reason's toleration
	// (repair.Config.Toleration).
	Toleration time.Duration
	// Clusters limits the replay to these clusters (the controller's
	// configured ones); nil means every cluster in the store.
	Clusters []string

	// NodePoolDeletionsPerHour, when > 0, replaces every cluster's stored
	// per-NodePool deletion budget per hour (what-if reports); 0: the
	// stored budget (store.Cluster), as the controller applies it.
	NodePoolDeletionsPerHour int

	Lookback     time.Duration // default DefaultLookback
	Resync       time.Duration // default DefaultResync
	DrainPerPass int           // default DefaultDrainPerPass
	ApprovalTTL  time.Duration // default DefaultApprovalTTL
	DeletingFor  time.Duration // default DefaultDeletingFor
	RepeatWindow time.Duration // default DefaultRepeatWindow
	MaxRange     time.Duration // default DefaultMaxRange
	MaxFindings  int           // default DefaultMaxFindings
}

func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Lookback, DefaultLookback)
	def(&c.Resync, DefaultResync)
	def(&c.ApprovalTTL, DefaultApprovalTTL)
	def(&c.DeletingFor, DefaultDeletingFor)
	def(&c.RepeatWindow, DefaultRepeatWindow)
	def(&c.MaxRange, DefaultMaxRange)
	if c.DrainPerPass <= 0 {
		c.DrainPerPass = DefaultDrainPerPass
	}
	if c.MaxFindings <= 0 {
		c.MaxFindings = DefaultMaxFindings
	}
	return c
}

// FromConfig returns the replay's Config for the controller configuration
// c, as the controller runs with it (cmd/runner gives controller/repair
// the same c): the policy (overrides and minimum healthy counts), the
// breakers, the toleration override, the resync period, the approval
// expiry, the paced release and the lookback. The budgets are the stored
// ones, which the controller sets from c at start. Store, Engine and
// Clusters are the caller's to set. An invalid breaker configuration is
// an error.
func FromConfig(c config.Config) (Config, error) {
	bp, err := c.BreakerPolicy()
	if err != nil {
		return Config{}, fmt.Errorf("shadow config: %w", err)
	}
	return Config{Policy: c.ResolvedPolicy(), Breaker: bp, Toleration: c.Repair.Toleration, Resync: c.Repair.Resync,
		ApprovalTTL: c.Repair.ApprovalTTL, DrainPerPass: c.Repair.DrainPerPass, Lookback: c.Repair.Lookback}, nil
}

// Limits returns the report's effective cost limits: the longest range,
// the most findings one report loads (range plus lookback), and the
// lookback read before since.
func (c Config) Limits() (maxRange time.Duration, maxFindings int, lookback time.Duration) {
	c = c.withDefaults()
	return c.MaxRange, c.MaxFindings, c.Lookback
}

// RangeTime reads a report bound: an RFC 3339 time, or a duration before
// now, a Go duration (90m, 168h) or whole days (7d). The CLI and the
// dashboard's shadow page take bounds this way; the API takes times only.
func RangeTime(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if days, ok := strings.CutSuffix(s, "d"); ok && err != nil {
		n, nerr := strconv.Atoi(days)
		d, err = time.Duration(n)*24*time.Hour, nerr
	}
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%q: want an RFC 3339 time (2026-11-23T12:00:00Z) or a duration before now (168h, 7d): %w", s, store.ErrInvalid)
	}
	return now.Add(-d), nil
}

// ReportFunc adapts Run to api.Config.Shadow.
func (c Config) ReportFunc() func(ctx context.Context, since, until time.Time) (any, error) {
	return func(ctx context.Context, since, until time.Time) (any, error) {
		rep, err := Run(ctx, c, since, until)
		if err != nil {
			return nil, err
		}
		return rep, nil
	}
}

// Why values of an Approval: what held the repair for on-call.
const (
	// WhyBreaker: the repair would have replaced the node, but a cohort
	// breaker, the fleet ceiling or the kill switch held it (the ledger's
	// held_by "breaker").
	WhyBreaker = "breaker"
	// WhyActionNotExecutable: the recommended action (reset-gpu, reboot,
	// restart-runtime, ...) is not executable with NodeClaim replacement, so
	// on-call decides (the ledger's held_by "action").
	WhyActionNotExecutable = "action-not-executable"
)

// Approval outcomes, as of the end of the range.
const (
	OutcomeReleased = "released" // the breaker closed (paced drain) or the diagnosis escalated to replace
	OutcomeResolved = "resolved" // the condition cleared first
	OutcomeExpired  = "expired"  // no approval within ApprovalTTL (nobody approves in a replay)
	OutcomePending  = "pending"  // still waiting at until
)

// Report is the shadow report. Times are RFC 3339 UTC. Node names are
// cluster-qualified by the Cluster field next to them; breaker evidence names
// nodes "cluster/node".
type Report struct {
	Since time.Time `json:"since"`
	Until time.Time `json:"until"`
	// Nodes counts the nodes in the replayed fleet (stored nodes known
	// before until, of the selected clusters).
	Nodes int `json:"nodes"`
	// Findings counts the stored findings in [since, until) that were
	// replayed; the lookback before since is read too, as history.
	Findings int `json:"findings"`
	// UntimedFindings counts those without an observation time, diagnosed
	// as happening when they are delivered (docs/shadow.md).
	UntimedFindings int `json:"untimedFindings"`
	// Deletions are the NodeClaim deletions the controller would have made.
	Deletions []Deletion `json:"deletions"`
	// ApprovalsNeeded are the repairs that would have waited for on-call.
	ApprovalsNeeded []Approval `json:"approvalsNeeded"`
	// Trips are breakers that opened, with their evidence.
	Trips []Trip `json:"trips"`
	// BudgetDelays are repairs the deletion budgets delayed (once per repair).
	BudgetDelays []BudgetDelay `json:"budgetDelays"`
	// Failed are repairs the controller could not execute: no Karpenter
	// NodeClaim owns the node.
	Failed []Failed `json:"failed"`
	// Open are the repairs still open at until, as the ledger would hold
	// them, oldest first.
	Open []Open `json:"open,omitempty"`
	// ByReason counts, per reason code, what happened to its repairs.
	ByReason map[string]*ReasonCounts `json:"byReason"`
	// Policy is the policy the replay applied.
	Policy PolicyView `json:"policy"`
	// Notes name the limits this report ran into (untimed findings, nodes
	// with too many findings, findings of deleted nodes left out).
	Notes []string `json:"notes,omitempty"`
}

// Deletion is one NodeClaim deletion the controller would have made.
type Deletion struct {
	Cluster  string    `json:"cluster"`
	Node     string    `json:"node"`
	NodePool string    `json:"nodepool,omitempty"`
	Reason   string    `json:"reason"`
	At       time.Time `json:"at"`
	// TolerationStartedAt is when the repair opened (its condition began).
	TolerationStartedAt time.Time `json:"tolerationStartedAt"`
	// Released is true when the deletion followed an approval hold that the
	// controller released itself (breaker closed, diagnosis escalated).
	Released bool `json:"released,omitempty"`
}

// Approval is one repair that would have needed on-call approval.
type Approval struct {
	Cluster string `json:"cluster"`
	Node    string `json:"node"`
	Reason  string `json:"reason"`
	// Why is WhyBreaker or WhyActionNotExecutable.
	Why string `json:"why"`
	// Action is the action the policy would execute (replace when a breaker
	// held it).
	Action string    `json:"action"`
	At     time.Time `json:"at"`
	// Detail is the text the ledger's audit entry would carry: the breaker,
	// its numbers and since when; or the non-executable action.
	Detail  string     `json:"detail"`
	Outcome string     `json:"outcome"`
	Ended   *time.Time `json:"ended,omitempty"`
}

// Trip is one breaker that opened during the range.
type Trip struct {
	// Cohort is "key=value", or "fleet" for the fleet ceiling.
	Cohort      string           `json:"cohort"`
	Scope       string           `json:"scope"`
	At          time.Time        `json:"at"`
	Message     string           `json:"message"`
	HaltRollout bool             `json:"haltRollout,omitempty"`
	Evidence    breaker.Evidence `json:"evidence"`
	// ClosedAt and CloseCause are set when it closed again within the range
	// (cooled-down; nobody resumes a breaker in a replay).
	ClosedAt   *time.Time `json:"closedAt,omitempty"`
	CloseCause string     `json:"closeCause,omitempty"`
}

// BudgetMinHealthy is BudgetDelay.Budget when the NodePool's minHealthy
// (policy file) held the deletion.
const BudgetMinHealthy = "nodepool_min_healthy"

// BudgetDelay is a repair a deletion budget delayed.
type BudgetDelay struct {
	Cluster string    `json:"cluster"`
	Node    string    `json:"node"`
	Reason  string    `json:"reason"`
	At      time.Time `json:"at"`
	// Budget is store.BudgetDeletionsPerHour,
	// store.BudgetMaxInFlightPerNodePool,
	// store.BudgetNodePoolDeletionsPerHour or BudgetMinHealthy.
	Budget string `json:"budget"`
	Detail string `json:"detail"`
}

// Failed is a repair the controller could not execute.
type Failed struct {
	Cluster string    `json:"cluster"`
	Node    string    `json:"node"`
	Reason  string    `json:"reason"`
	At      time.Time `json:"at"`
	Why     string    `json:"why"`
}

// Open is a repair still open at the end of the range.
type Open struct {
	Cluster string `json:"cluster"`
	Node    string `json:"node"`
	Reason  string `json:"reason"`
	// State is tolerating, awaiting_approval or approved (failed ones are
	// in Failed).
	State string `json:"state"`
	// TolerationStartedAt is when the repair opened; TolerationUntil when
	// its toleration ends (or ended: a budget delays it).
	TolerationStartedAt time.Time `json:"tolerationStartedAt"`
	TolerationUntil     time.Time `json:"tolerationUntil"`
	// HeldBy is WhyBreaker or WhyActionNotExecutable while awaiting approval.
	HeldBy string `json:"heldBy,omitempty"`
	// WaitingOn is the node's owners' hold on the deletion after the
	// toleration (decide.HoldDoNotDisrupt "do-not-disrupt", HoldOptOut
	// "opt-out"), as the controller last recorded it for the node.
	WaitingOn string `json:"waitingOn,omitempty"`
}

// ReasonCounts is what happened to one reason's repairs.
type ReasonCounts struct {
	// Repairs counts repairs opened (a condition diagnosis reached the ledger).
	Repairs         int `json:"repairs"`
	Deletions       int `json:"deletions"`
	ApprovalsNeeded int `json:"approvalsNeeded"`
	// HeldByBreaker and NotExecutable split ApprovalsNeeded by Why.
	HeldByBreaker int `json:"heldByBreaker"`
	NotExecutable int `json:"notExecutable"`
	BudgetDelayed int `json:"budgetDelayed"`
	// OwnersHeld counts repairs whose deletion the node's owners held
	// (karpenter.sh/do-not-disrupt, fleetrepair.dev/repair=disabled).
	OwnersHeld int `json:"ownersHeld"`
	Failed     int `json:"failed"`
	// Resolved counts repairs whose condition cleared before any deletion.
	Resolved int `json:"resolved"`
	Expired  int `json:"expired"`
}

// PolicyView is the policy the replay applied.
type PolicyView struct {
	// Breakers is the effective breaker configuration; nil: breakers off.
	Breakers *breaker.Config `json:"breakers,omitempty"`
	// TolerationOverride is Config.Toleration when set ("10m0s").
	TolerationOverride string `json:"tolerationOverride,omitempty"`
	// PolicyOverrides is true when an operator policy file is in force.
	PolicyOverrides bool `json:"policyOverrides"`
	// Budgets are the clusters' current deletion budgets.
	Budgets            map[string]Budget `json:"budgets"`
	ResyncSeconds      float64           `json:"resyncSeconds"`
	DrainPerPass       int               `json:"drainPerPass"`
	ApprovalTTLSeconds float64           `json:"approvalTTLSeconds"`
	DeletingForSeconds float64           `json:"deletingForSeconds"`
	LookbackSeconds    float64           `json:"lookbackSeconds"`
	// CatalogVersion is the reason catalog's version.
	CatalogVersion string `json:"catalogVersion"`
}

// Budget is one cluster's deletion budgets (store.Cluster, plus the
// per-NodePool hourly budget of Config).
type Budget struct {
	DeletionsPerHour         int `json:"deletionsPerHour"`
	MaxInFlightPerNodePool   int `json:"maxInFlightPerNodePool"`
	NodePoolDeletionsPerHour int `json:"nodePoolDeletionsPerHour"`
}

// Run replays [since, until) and returns the report. A bad range (since
// zero, since not before until, longer than Config.MaxRange) or a range
// holding more than Config.MaxFindings findings (counted in the database
// before any is loaded) is an error wrapping store.ErrInvalid; store errors
// are returned wrapped.
func Run(ctx context.Context, cfg Config, since, until time.Time) (*Report, error) {
	if cfg.Store == nil || cfg.Engine == nil {
		return nil, errors.New("shadow report: Store and Engine are required")
	}
	cfg = cfg.withDefaults()
	since, until = since.UTC(), until.UTC()
	if err := CheckRange(since, until, cfg.MaxRange); err != nil {
		return nil, err
	}
	// Count before loading: a range holding too many findings is refused
	// without reading one (issue 11: one request loaded 600 MB before the
	// cap was checked).
	from := since.Add(-cfg.Lookback)
	if n, err := cfg.Store.CountFindings(ctx, cfg.Clusters, from, until, cfg.MaxFindings); err != nil {
		return nil, fmt.Errorf("shadow report: %w", err)
	} else if n > cfg.MaxFindings {
		return nil, fmt.Errorf("shadow report: the range and its %s lookback hold more than the %d findings one report replays; narrow the range: %w",
			cfg.Lookback, cfg.MaxFindings, store.ErrInvalid)
	}
	r, err := load(ctx, cfg, since, until)
	if err != nil {
		return nil, err
	}
	if err := r.run(ctx); err != nil {
		return nil, fmt.Errorf("shadow report: %w", err)
	}
	return r.out, nil
}

// CheckRange validates a report range: since set, since before until, and
// until - since at most maxRange (<= 0: DefaultMaxRange). The error wraps
// store.ErrInvalid and says which rule failed.
func CheckRange(since, until time.Time, maxRange time.Duration) error {
	if maxRange <= 0 {
		maxRange = DefaultMaxRange
	}
	switch {
	case since.IsZero():
		return fmt.Errorf("shadow report: since is required: %w", store.ErrInvalid)
	case !since.Before(until):
		return fmt.Errorf("shadow report: since %s must be before until %s: %w",
			since.Format(time.RFC3339), until.Format(time.RFC3339), store.ErrInvalid)
	case until.Sub(since) > maxRange+time.Minute: // a minute of slack: "--since 31d" resolved a moment before now
		return fmt.Errorf("shadow report: range %s is longer than the maximum %s: %w",
			until.Sub(since), maxRange, store.ErrInvalid)
	}
	return nil
}

// load reads the fleet, the budgets and every node's findings from
// since - Lookback to until.
func load(ctx context.Context, cfg Config, since, until time.Time) (*replay, error) {
	clusters, err := cfg.Store.ListClusters(ctx)
	if err != nil {
		return nil, fmt.Errorf("shadow report: %w", err)
	}
	stored, err := cfg.Store.ListNodes(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("shadow report: %w", err)
	}
	want := map[string]bool{}
	for _, c := range cfg.Clusters {
		want[c] = true
	}
	r := newReplay(cfg, since, until)
	for _, c := range clusters {
		if len(want) == 0 || want[c.Name] {
			r.budgets[c.Name] = Budget{DeletionsPerHour: c.DeletionsPerHour, MaxInFlightPerNodePool: c.MaxInFlightPerNodePool,
				NodePoolDeletionsPerHour: r.nodePoolPerHour(c.NodePoolDeletionsPerHour)}
		}
	}
	r.out.Policy.Budgets = r.budgets
	var labels []string
	if cfg.Breaker != nil {
		labels = cfg.Breaker.Config().Labels
	}
	var nodes []*node
	for _, sn := range stored {
		if len(want) > 0 && !want[sn.Cluster] {
			continue
		}
		nodes = append(nodes, newNode(sn, labels))
	}

	from := since.Add(-cfg.Lookback)
	// budget counts down the findings still allowed, over every node, so an
	// oversized range stops early instead of filling memory first.
	var budget atomic.Int64
	budget.Store(int64(cfg.MaxFindings))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(loadWorkers)
	for _, n := range nodes {
		g.Go(func() error { return n.load(gctx, cfg.Store, from, until, &budget) })
	}
	if err := g.Wait(); errors.Is(err, errTooMany) {
		return nil, fmt.Errorf("shadow report: the range and its %s lookback hold more than the %d findings one report replays; narrow the range: %w",
			cfg.Lookback, cfg.MaxFindings, store.ErrInvalid)
	} else if err != nil {
		return nil, fmt.Errorf("shadow report: %w", err)
	}
	truncated := 0
	for _, n := range nodes {
		if n.truncated {
			truncated++
		}
	}
	if truncated > 0 {
		r.note("%d node(s) have more than %d findings in the range; their later findings are left out", truncated, maxFindingsPerNode)
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].key < nodes[j].key })
	r.index(nodes)
	return r, nil
}

// errTooMany stops loading when the range holds more than MaxFindings.
var errTooMany = errors.New("too many findings")

// timed is one stored finding with the time the replay delivers it at.
type timed struct {
	// at is when the controller received the finding (its report's ingest
	// time): the live controller reconciles a node when a report stores
	// new findings, so findings of one report are delivered together and a
	// spooled finding arrives late, as it did live. The diagnosis reads
	// f.Time, when the fault happened.
	at time.Time
	f  finding.Finding
	// untimed: the finding has no observation time (Time zero); the
	// diagnosis treats it as happening "now", so a node holding one is
	// diagnosed again at every pass (node.volatile).
	untimed bool
}

// load reads the node's findings that happened from `from` to until,
// paging past the store's per-call limit, and orders them by receipt
// (stable: the store's order, by the time they happened, within one
// report). A finding received at or after until is left out: the live
// controller had not seen it.
func (n *node) load(ctx context.Context, st *store.Store, from, until time.Time, budget *atomic.Int64) error {
	defer slices.SortStableFunc(n.fs, func(a, b timed) int { return a.at.Compare(b.at) })
	seen := map[string]bool{}
	cursor := from
	for {
		page, err := st.FindingsForNodeRange(ctx, n.cluster, n.name, cursor, until, store.MaxFindingsLimit)
		if err != nil {
			return err
		}
		progress := false
		for _, rf := range page {
			happened := rf.Time
			if happened.IsZero() {
				happened = rf.Received
			}
			cursor = happened
			if seen[rf.ID] {
				continue
			}
			seen[rf.ID], progress = true, true
			if !rf.Received.Before(until) {
				continue
			}
			if budget.Add(-1) < 0 {
				return errTooMany
			}
			n.fs = append(n.fs, timed{at: rf.Received, f: rf.Finding, untimed: rf.Time.IsZero()})
			if len(n.fs) >= maxFindingsPerNode {
				n.truncated = true
				return nil
			}
		}
		if len(page) < store.MaxFindingsLimit {
			return nil
		}
		if !progress {
			// A whole page at one instant that was read before: the store
			// cannot page past it by time.
			n.truncated = true
			return nil
		}
	}
}
