// Package repair is the controller's reconciler: for one node it reads the
// findings from the store, asks controller/diagnose for a verdict, records
// the diagnoses, writes NodeConditions, Events and the quarantine taint, and
// drives the node's repair through the ledger: toleration clock, guard
// transaction (controller/store BeginDeletion), NodeClaim deletion with a UID
// precondition, and the check that the NodeClaim is gone.
//
// It is the only writer to Kubernetes. Every step is recorded before it is
// acted on, and every step is idempotent, so a crash or a second replica
// anywhere in the sequence repeats a step at most, never skips the guards.
package repair

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"

	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/config"
	"github.com/fleetrepair/fleetrepair/controller/decide"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/lifecycle"
	"github.com/fleetrepair/fleetrepair/controller/policy"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// Actor is the audit identity of the controller's own decisions.
const Actor = decide.Actor

// Config configures a Reconciler.
type Config struct {
	Store    *store.Store
	Engine   *diagnose.Engine
	Clusters map[string]*kube.Cluster
	// DryRun records every decision and deletes no NodeClaim.
	DryRun bool
	// Toleration, when > 0, replaces every reason's catalog toleration
	// (demos and tests use seconds).
	Toleration time.Duration
	// Policy holds operator overrides per reason and NodePool (nil: none).
	Policy *policy.Policy
	// Lookback bounds the history of earlier boots read per node (default 7
	// days): older faults of earlier boots no longer escalate. Findings of
	// the current boot always count.
	Lookback time.Duration
	// Resync is the period of the full pass over open repairs, which
	// evaluates the breakers first (default 10s).
	Resync time.Duration
	// Workers is the number of nodes reconciled at once (default 4). Each
	// holds at most one PostgreSQL connection at a time.
	Workers int
	// EvidenceGroup is the most nodes whose evidence-step reads (and
	// ledger writes) share one PostgreSQL round trip (evidence.go; default
	// DefaultEvidenceGroup; 1: every node alone).
	EvidenceGroup int
	// RetryBase and RetryMax bound the per-node exponential backoff of a
	// failed reconcile (defaults 500ms and 5m).
	RetryBase, RetryMax time.Duration
	// ReconcileTimeout bounds one node's reconcile (default 1m).
	ReconcileTimeout time.Duration
	// ProbeTimeout bounds each cluster's reachability probe and Node read
	// in the periodic pass (default 10s).
	ProbeTimeout time.Duration
	// CatchUpLookback is how far back the first periodic pass (and the
	// first after this replica gains a cluster's Lease) looks for nodes with
	// findings to reconcile (default 15m): what a crashed replica had
	// queued is reconciled by whoever runs next.
	CatchUpLookback time.Duration
	// FreshEvidence is how recent a node's newest finding must be for the
	// catch-up after a start or a newly taken Lease to queue it at
	// PriorityEvidence, the newest first, ahead of the rest of the
	// CatchUpLookback (default DefaultFreshEvidence): it must cover the
	// triggers the old leader never handled, its own backlog and the
	// leaderless gap (the Lease duration), so the controller sets at least
	// three Lease durations (cmd/runner). queue.go, catchUp.
	FreshEvidence time.Duration
	// MaxBreakerAge is the oldest breaker evaluation the deletion guard acts
	// on (default 3 x Resync, at least 30s): an older one is refused and
	// retried, so a stalled periodic pass never lets a deletion through on
	// stale evidence.
	MaxBreakerAge time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	Log *slog.Logger
	// Registerer receives the reconciler's metrics (optional).
	Registerer prometheus.Registerer
	// Breaker is the cohort breaker policy (nil: breakers off).
	Breaker *breaker.Policy
	// DrainPerPass is how many breaker-held repairs one periodic pass
	// releases after their breaker closed (default 1): no stampede.
	DrainPerPass int
	// VerifyTimeout bounds the wait for a healthy replacement after a
	// deletion (default DefaultVerifyTimeout).
	VerifyTimeout time.Duration
	// ApprovalTTL is how long a repair waits for on-call approval before it
	// expires (default 24h).
	ApprovalTTL time.Duration
	// Events writes the Kubernetes Events of the repairs' steps on their
	// Nodes and NodeClaims: quarantine, deletion and every hold (nil:
	// none; the diagnoses' own Events are written regardless).
	Events *kube.Events
	// Lifecycle are the graces after which a NodeClaim in a transitional
	// lifecycle state is stuck (zero fields: lifecycle.DefaultGraces).
	Lifecycle lifecycle.Graces
	// Crash is fault injection for the HA tests and the fault suite
	// (test/load): when it returns true at a named point (CrashPoints) the
	// reconciler stops right there, as a killed process would. Nil in
	// production.
	Crash func(point string) bool
}

// CrashPoints are the points of a repair where Config.Crash is asked, in
// the order a replacement passes them:
//
//   - after-quarantine: the NodeCondition and NoSchedule taint are set, the
//     ledger still says detected;
//   - after-quarantined, after-tolerating: the transition is recorded (the
//     repair waits out its toleration window in tolerating);
//   - before-begin-deletion: the deletion guards were read, their
//     transaction (BeginDeletion) not run;
//   - after-begin-deletion: the guards passed and the repair is deleting,
//     no delete call issued;
//   - after-delete-call: the NodeClaim delete was issued;
//   - waiting-replacement: the NodeClaim is being deleted (Karpenter's
//     finalizer holds it), the repair waits for it to be gone.
var CrashPoints = []string{"after-quarantine", "after-quarantined", "after-tolerating", "before-begin-deletion",
	"after-begin-deletion", "after-delete-call", "waiting-replacement"}

// ErrCrashed is returned when Config.Crash stopped a reconcile.
var ErrCrashed = errors.New("reconcile stopped by fault injection")

func (r *Reconciler) crash(point string) bool { return r.cfg.Crash != nil && r.cfg.Crash(point) }

// Reconciler drives diagnoses and repairs. Create it with New.
type Reconciler struct {
	cfg Config
	log *slog.Logger
	// evidence is the database part of every reconcile (ReadNode and
	// WriteNodeLedger): the store, or groups of nodes sharing round trips
	// (evidence.go).
	evidence ledgerDB

	mu sync.Mutex
	// queue holds the nodes to reconcile: controller-runtime's priority
	// queue (per-node deduplication, exponential per-node backoff, client-go's
	// work queue metrics; the higher priority first, FIFO within one). The
	// priorities are in queue.go.
	queue priorityqueue.PriorityQueue[nodeKey]
	// forward holds triggers for clusters another replica leads
	// (forwardLoop sends them); catchUpFrom is where the next pass's
	// catch-up on new findings starts (zero: CatchUpLookback back).
	forward        []store.NodeRef
	forwardDropped prometheus.Counter
	catchUpFrom    time.Time
	catchUpGen     int // bumped by every reset of catchUpFrom
	// catchUpEvidence: the next catch-up queues the nodes whose newest
	// finding is at or after it at PriorityEvidence (zero: none, or
	// FreshEvidence back when catchUpFrom is zero too).
	catchUpEvidence time.Time
	// wakes holds each node's PriorityFollowUp trigger at the end of its
	// repair's toleration window (wakeAt).
	wakes map[nodeKey]*wakeup
	// awaiting holds the nodes whose deletion waits for a fresh breaker
	// evaluation (awaitBreakers).
	awaiting map[nodeKey]bool
	// evaluate asks for a breaker evaluation now (EvaluateSoon), pass for
	// the whole periodic pass (PassSoon).
	evaluate, pass chan struct{}
	// leading is nil when leader election is off (every cluster is ours);
	// else the clusters whose Lease this replica holds.
	leading map[string]bool
	// clusters holds the reachability of each cluster's API server.
	clusters map[string]ClusterState

	// members are the served clusters (Config.Clusters, then AddCluster
	// and RemoveCluster); runCtx is Run's context once it runs.
	membersMu sync.RWMutex
	members   map[string]*member
	runCtx    context.Context

	// released counts breaker-held repairs released in the current pass.
	released int
	// stuckTold is, per cluster, the NodeClaims TellStuck told and in which
	// stuck state.
	stuckTold map[string]map[string]string
	// claims holds each cluster's classified NodeClaims of the last pass.
	claims     map[string]claimSnapshot
	claimGauge *prometheus.GaugeVec

	breakersOpen       prometheus.Gauge
	timeToReplace      prometheus.Histogram
	replacementsFailed prometheus.Counter
	nodeConditions     *prometheus.GaugeVec // fleetrepair_node_conditions (interop.go)
	reconciles         *prometheus.CounterVec
	deletions          *prometheus.CounterVec
	transitions        *prometheus.CounterVec
	sweptNodes         *prometheus.CounterVec // fleetrepair_nodes_swept_removed_total (sweep.go)

	// lastBreakers is the breaker state this replica last saved (nil
	// before the first pass): the diagnosis reads the software cohorts it
	// holds suspect from it, one pass stale at most.
	lastBreakers atomic.Pointer[breaker.State]
}

type nodeKey struct{ cluster, node string }

// New validates cfg and returns a Reconciler.
func New(cfg Config) (*Reconciler, error) {
	if cfg.Store == nil || cfg.Engine == nil {
		return nil, errors.New("new reconciler: Store and Engine are required")
	}
	if cfg.Lookback == 0 {
		cfg.Lookback = config.DefaultLookback
	}
	if cfg.Resync == 0 {
		cfg.Resync = config.DefaultResync
	}
	if cfg.Workers == 0 {
		cfg.Workers = config.DefaultWorkers
	}
	if cfg.EvidenceGroup == 0 {
		cfg.EvidenceGroup = DefaultEvidenceGroup
	}
	if cfg.RetryBase == 0 {
		cfg.RetryBase = 500 * time.Millisecond
	}
	if cfg.RetryMax == 0 {
		cfg.RetryMax = 5 * time.Minute
	}
	if cfg.ReconcileTimeout == 0 {
		cfg.ReconcileTimeout = time.Minute
	}
	if cfg.CatchUpLookback == 0 {
		cfg.CatchUpLookback = 15 * time.Minute
	}
	if cfg.ProbeTimeout == 0 {
		cfg.ProbeTimeout = 10 * time.Second
	}
	if cfg.FreshEvidence == 0 {
		cfg.FreshEvidence = DefaultFreshEvidence
	}
	if cfg.Workers < 0 || cfg.EvidenceGroup < 0 || cfg.RetryBase < 0 || cfg.RetryMax < cfg.RetryBase || cfg.ReconcileTimeout < 0 || cfg.ProbeTimeout < 0 || cfg.FreshEvidence < 0 {
		return nil, errors.New("new reconciler: Workers, EvidenceGroup, RetryBase, ReconcileTimeout, ProbeTimeout and FreshEvidence must not be negative, RetryMax not below RetryBase")
	}
	if cfg.MaxBreakerAge == 0 {
		cfg.MaxBreakerAge = config.MaxBreakerAgeOf(cfg.Resync)
	}
	if cfg.DrainPerPass == 0 {
		cfg.DrainPerPass = config.DefaultDrainPerPass
	}
	if cfg.ApprovalTTL == 0 {
		cfg.ApprovalTTL = config.DefaultApprovalTTL
	}
	if cfg.Resync < 0 || cfg.Toleration < 0 || cfg.Lookback < 0 || cfg.MaxBreakerAge < 0 {
		return nil, errors.New("new reconciler: Resync, Toleration, Lookback and MaxBreakerAge must not be negative")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	r := &Reconciler{cfg: cfg, log: cfg.Log, evaluate: make(chan struct{}, 1), pass: make(chan struct{}, 1), wakes: map[nodeKey]*wakeup{},
		members: map[string]*member{},
		reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetrepair_reconcile_total",
			Help: "Node reconciliations by result (ok, error)."}, []string{"result"}),
		deletions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetrepair_nodeclaim_deletions_total",
			Help: "NodeClaim deletions issued, by cluster and dry_run."}, []string{"cluster", "dry_run"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetrepair_repair_transitions_total",
			Help: "Repair state transitions made by the controller, by target state."}, []string{"to"}),
		breakersOpen: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fleetrepair_breakers_open",
			Help: "Cohort breakers open after the last evaluation."}),
		timeToReplace: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fleetrepair_time_to_replace_seconds",
			Help:    "From the NodeClaim deletion to the replacement Node Ready and healthy, in seconds.",
			Buckets: prometheus.ExponentialBuckets(15, 2, 10)}),
		forwardDropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "fleetrepair_forward_dropped_total",
			Help: "Triggers for another replica's clusters not forwarded (queue full or PostgreSQL down); the leader's catch-up pass reconciles them."}),
		replacementsFailed: prometheus.NewCounter(prometheus.CounterOpts{Name: "fleetrepair_replacements_failed_total",
			Help: "Replacements not Ready and healthy within the verify timeout."}),
		nodeConditions: newConditionsGauge(),
		claimGauge:     nodeClaimGauge(),
		sweptNodes:     newSweptCounter(),
	}
	var qm workqueue.MetricsProvider
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{r.reconciles, r.deletions, r.transitions, r.breakersOpen, r.timeToReplace, r.replacementsFailed, r.forwardDropped, r.nodeConditions, r.claimGauge, r.sweptNodes,
			newLeaderCollector(r)} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("register repair metrics: %w", err)
			}
		}
		var err error
		if qm, err = newQueueMetrics(cfg.Registerer); err != nil {
			return nil, err
		}
	}
	name := "nodes"
	if qm == nil {
		name = "" // no metrics (controller-runtime's default would be its global registry)
	}
	r.queue = priorityqueue.New(name, func(o *priorityqueue.Opts[nodeKey]) {
		o.RateLimiter = workqueue.NewTypedItemExponentialFailureRateLimiter[nodeKey](cfg.RetryBase, cfg.RetryMax)
		o.MetricProvider = qm
	})
	r.evidence = cfg.Store
	if cfg.EvidenceGroup > 1 {
		r.evidence = newEvidenceGroups(cfg.Store, cfg.EvidenceGroup)
	}
	for name, k := range cfg.Clusters {
		if k == nil {
			return nil, fmt.Errorf("new reconciler: cluster %s has no Kubernetes access", name)
		}
		r.members[name] = &member{k: k}
	}
	return r, nil
}

// ReconcileNode brings one node's diagnoses, Kubernetes state and repair up
// to date with its findings. It is idempotent. Errors are returned wrapped;
// the next pass retries.
func (r *Reconciler) ReconcileNode(ctx context.Context, cluster, node string) error {
	_, err := r.reconcile(ctx, cluster, node, false)
	return err
}

// reconciled is what a reconcile tells the work queue.
type reconciled struct {
	// wake is when the node's repair next needs a reconcile without new
	// evidence: the end of its toleration window (zero: nothing known).
	wake time.Time
	// held (ledgerOnly): the node's repair is open and an open breaker
	// holds it.
	held bool
}

// reconcile is ReconcileNode. With ledgerOnly it stops after the database
// part: findings read, diagnoses recorded, a repair opened for a new
// condition-severity diagnosis; no Kubernetes write, no ledger step beyond
// Detected (the work queue's evidence priority, queue.go: in a wave every
// repair opens before any node's rate-limited API writes). It returns what
// the work queue needs to know next (reconciled).
func (r *Reconciler) reconcile(ctx context.Context, cluster, node string, ledgerOnly bool) (reconciled, error) {
	k := r.kubeFor(cluster)
	if k == nil {
		return reconciled{}, fmt.Errorf("reconcile %s/%s: %w", cluster, node, ErrUnknownCluster)
	}
	now := r.cfg.Now()
	info, err := k.NodeInfo(ctx, node)
	r.observe(cluster, err)
	if apierrors.IsNotFound(errors.Unwrap(err)) || apierrors.IsNotFound(err) {
		// The Node is gone (replaced, scaled down): nothing of it stays active.
		open, err := r.cfg.Store.OpenRepairForNode(ctx, cluster, node)
		hasOpen := err == nil
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return reconciled{}, fmt.Errorf("reconcile %s/%s: %w", cluster, node, err)
		}
		if _, err := r.cfg.Store.DeactivateDiagnoses(ctx, cluster, node, nil, now); err != nil {
			return reconciled{}, fmt.Errorf("reconcile %s/%s: %w", cluster, node, err)
		}
		// Out of the fleet counts and silent-agent gauges, history kept.
		if err := r.cfg.Store.MarkNodeRemoved(ctx, cluster, node, now); err != nil {
			return reconciled{}, fmt.Errorf("reconcile %s/%s: %w", cluster, node, err)
		}
		if hasOpen && !ledgerOnly {
			return reconciled{}, r.nodeGone(ctx, k, open, now)
		}
		return reconciled{}, nil
	}
	if err != nil {
		return reconciled{}, fmt.Errorf("reconcile %s/%s: %w", cluster, node, err)
	}
	// One round trip: the node's Kubernetes facts recorded, its agent row,
	// open and latest repair, findings and the saved breaker state read
	// (store.ReadNode), shared with the other reconciles reading at the
	// moment (evidence.go): the evidence step's and every follow-up's, so
	// a wave's follow-ups and the watches' echoes of their writes cost
	// PostgreSQL what the evidence step costs, not twice as much.
	db := r.evidence
	snap, err := db.ReadNode(ctx, store.Node{Cluster: cluster, Name: node, NodePool: info.NodePool,
		Zone: info.Zone, InstanceType: info.InstanceType, NodeClaim: info.NodeClaim, Labels: r.cohortLabels(info)}, 10000, now)
	if err != nil {
		return reconciled{}, fmt.Errorf("reconcile %s/%s: %w", cluster, node, err)
	}
	n, open, hasOpen := snap.Node, snap.Open, snap.HasOpen
	// Every finding of the current boot counts, however old (a GPU lost 20
	// days ago in this boot is still lost); earlier boots only within the
	// lookback (history that escalates). Findings without a boot ID count as
	// current.
	fs := snap.Findings[:0]
	for _, f := range snap.Findings {
		if f.BootID == "" || f.BootID == n.BootID || f.Time.IsZero() || now.Sub(f.Time) <= r.cfg.Lookback {
			fs = append(fs, f)
		}
	}
	fs = append(fs, conditionFindings(node, n.BootID, info.Conditions)...)
	fs = append(fs, lifecycleFindings(node, n.BootID, info)...)
	var suspects []string
	if st := r.lastBreakers.Load(); st != nil {
		suspects = st.SoftwareSuspects(r.breakerNode(cluster, info, n))
	}
	ds := r.cfg.Engine.Diagnose(diagnose.Input{Cluster: cluster, Node: node, BootID: n.BootID, Findings: fs, Now: now,
		InstanceType: info.InstanceType, NodeCreated: info.Created, SuspectSoftware: suspects, InventoryGPUs: inventoryGPUs(n), Inventory: inventory(n)})
	ds = r.applyPolicy(ds, info.NodePool)
	head := diagnose.Headline(ds)
	// Already leaving: Karpenter drains and removes it. A repair would only
	// send a second delete (c27); the diagnoses and their Events stay
	// visible.
	gone := head.Severity == catalog.SeverityCondition && !hasOpen && leaving(info.Lifecycle(now, r.cfg.Lifecycle))
	// One round trip and one transaction: the diagnoses, and for a
	// condition diagnosis the repair opened or its findings linked.
	var rec ledgerStep
	if head.Severity == catalog.SeverityCondition && !gone {
		rec, err = r.openRepair(ctx, db, k, info, head, ds, open, hasOpen, snap, now)
	} else {
		rec.events, _, err = r.writeLedger(ctx, db, k, n.BootID, node, ds, store.NodeLedger{}, now)
	}
	if err != nil {
		return reconciled{}, err
	}
	if gone {
		if ledgerOnly {
			return reconciled{}, nil // the Events are the follow-up's
		}
		return reconciled{}, r.recordEvents(ctx, k, node, rec.events, now)
	}
	var out reconciled
	switch {
	case head.Severity != catalog.SeverityCondition && ledgerOnly:
		return reconciled{}, nil // clearing the condition and taint is the follow-up's
	case head.Severity != catalog.SeverityCondition:
		err = r.healthy(ctx, k, node, head, open, hasOpen, now)
	case ledgerOnly:
		if rec.suppressed || rec.repair.ID == 0 {
			return reconciled{}, nil
		}
		// The saved state read with the node: it only chooses the
		// follow-up's priority (PriorityHeld); every decision the follow-up
		// makes reads the breakers again (advance, BeginDeletion).
		st, err := decodeBreakers(snap.Breakers)
		if err != nil {
			return reconciled{}, err
		}
		return reconciled{held: !r.allows(st, nodeFromInfo(cluster, info, n))}, nil
	default:
		out.wake, err = r.unhealthy(ctx, k, info, nodeFromInfo(cluster, info, n), head, rec.repair, rec.suppressed, now)
	}
	if err != nil {
		return reconciled{}, err
	}
	return out, r.recordEvents(ctx, k, node, rec.events, now)
}

// ledgerStep is what the database part of a reconcile recorded
// (openRepair, writeLedger).
type ledgerStep struct {
	// events are the stored diagnoses whose Kubernetes Event is not
	// written yet.
	events []pendingEvent
	// repair is the node's open repair (zero when none was opened);
	// suppressed: the latest repair already settled this fault, nothing
	// opened.
	repair     store.Repair
	suppressed bool
}

// pendingEvent is a stored diagnosis whose Kubernetes Event is not written
// yet.
type pendingEvent struct {
	rec store.DiagnosisRecord
	d   diagnose.Diagnosis
}

// writeLedger stores the diagnoses and deactivates the ones whose
// evidence cleared, with the rest of w (a repair to open, findings to link)
// in the same transaction (db's WriteNodeLedger); it returns the
// diagnoses that still need their Kubernetes Event and what the store
// wrote. Events are written after the ledger step (recordEvents), so in a
// wave a repair opens after database work only, not behind the API
// client's rate limit; an Event not written yet is written by the next
// reconcile (EventRecordedAt stays zero until it is).
func (r *Reconciler) writeLedger(ctx context.Context, db ledgerDB, k *kube.Cluster, bootID, node string, ds []diagnose.Diagnosis, w store.NodeLedger, now time.Time) ([]pendingEvent, store.NodeLedgerResult, error) {
	w.Cluster, w.Node = k.Name(), node
	w.Diagnoses = make([]store.DiagnosisRecord, 0, len(ds))
	for _, d := range ds {
		w.Diagnoses = append(w.Diagnoses, store.DiagnosisRecord{
			Cluster: k.Name(), Node: node, BootID: bootID, Reason: d.Reason, Severity: string(d.Severity),
			FaultClass: d.FaultClass, Action: string(d.Action), ConditionType: d.ConditionType,
			CatalogVersion: d.CatalogVersion, FirstSeen: d.FirstSeen, LastSeen: d.LastSeen, FindingIDs: d.FindingIDs,
			Detail: map[string]any{"message": d.Message, "gpus": d.GPUs, "escalated": d.Escalated,
				"escalateTo": d.EscalateTo, "urgency": d.Urgency, "evidence": d.Evidence, "count": d.Count},
		})
	}
	res, err := db.WriteNodeLedger(ctx, w, now)
	if err != nil {
		return nil, res, fmt.Errorf("record diagnoses on %s/%s: %w", k.Name(), node, err)
	}
	var pending []pendingEvent
	for i, d := range ds {
		if rec := res.Diagnoses[i]; rec.EventRecordedAt.IsZero() && d.Severity != catalog.SeverityNone {
			pending = append(pending, pendingEvent{rec: rec, d: d})
		}
	}
	return pending, res, nil
}

// recordEvents writes one Kubernetes Event per pending diagnosis and marks
// it recorded.
func (r *Reconciler) recordEvents(ctx context.Context, k *kube.Cluster, node string, pending []pendingEvent, now time.Time) error {
	for _, p := range pending {
		rec, d := p.rec, p.d
		evType := corev1.EventTypeWarning
		if d.Severity == catalog.SeverityEvent && d.FaultClass == "none" {
			evType = corev1.EventTypeNormal
		}
		if err := k.RecordEvent(ctx, node, evType, d.Reason, d.Message, fmt.Sprintf("diagnosis-%d-%s", rec.ID, rec.CreatedAt.Format(time.RFC3339Nano)), now); err != nil {
			return err
		}
		if err := r.cfg.Store.MarkEventRecorded(ctx, rec.ID, now); err != nil {
			return fmt.Errorf("mark event recorded: %w", err)
		}
	}
	return nil
}

// effective resolves the policy for a diagnosis in a NodePool.
func (r *Reconciler) effective(d diagnose.Diagnosis, nodePool string) policy.Effective {
	return r.cfg.Policy.ForDiagnosis(r.cfg.Engine.Catalog(), d, nodePool, r.cfg.Toleration)
}

// applyPolicy turns disabled reasons' conditions into events (policy.Apply).
func (r *Reconciler) applyPolicy(ds []diagnose.Diagnosis, nodePool string) []diagnose.Diagnosis {
	return r.cfg.Policy.Apply(r.cfg.Engine.Catalog(), ds, nodePool)
}

// unhealthy handles a node whose headline diagnosis has condition severity,
// after its repair was opened (openRepair; suppressed: the latest repair
// already settled this fault and none was): the quarantine written, the
// repair advanced. It returns when the repair next needs a reconcile (see
// reconcile).
func (r *Reconciler) unhealthy(ctx context.Context, k *kube.Cluster, info kube.NodeInfo, sn heldNode, head diagnose.Diagnosis, open store.Repair, suppressed bool, now time.Time) (time.Time, error) {
	if err := r.quarantine(ctx, k, info.Name, head, now, nil); err != nil || suppressed {
		return time.Time{}, err
	}
	if open.State == ledger.Detected && r.crash("after-quarantine") {
		return time.Time{}, ErrCrashed
	}
	open, err := r.retarget(ctx, open, head, now)
	if err != nil {
		return time.Time{}, err
	}
	rp, err := r.advance(ctx, k, info, sn, open, head, now)
	if err != nil || rp.State != ledger.Tolerating {
		return time.Time{}, err
	}
	return rp.TolerationUntil, nil
}

// openRepair records the diagnoses ds of a node whose headline head has
// condition severity and, in the same transaction (writeLedger), opens
// the node's repair for head, unless it has one (then it links head's
// findings to it) or the latest repair (snap.Last) already settled this
// fault (suppressed, nothing opened). Database work only.
func (r *Reconciler) openRepair(ctx context.Context, db ledgerDB, k *kube.Cluster, info kube.NodeInfo, head diagnose.Diagnosis, ds []diagnose.Diagnosis,
	open store.Repair, hasOpen bool, snap store.NodeSnapshot, now time.Time) (ledgerStep, error) {
	node := info.Name
	var (
		w   store.NodeLedger
		out ledgerStep
		tol time.Duration
	)
	switch {
	case hasOpen:
		w.LinkTo, w.LinkFindings = open.ID, head.FindingIDs
		out.repair = open
	case snap.HasLast && decide.Suppressed(ledgerRow(snap.Last), snap.Last.Reason, string(info.NodeClaimUID), head.Reason, r.cfg.DryRun):
		out.suppressed = true
	default:
		tol = decide.Toleration(head, r.effective(head, info.NodePool).Toleration)
		w.Open = &store.Repair{
			Cluster: k.Name(), Node: node, NodeClaim: info.NodeClaim, NodeClaimUID: string(info.NodeClaimUID),
			NodePool: info.NodePool, Reason: head.Reason, FaultClass: head.FaultClass,
			RecommendedAction: string(head.Action), DryRun: r.cfg.DryRun, State: ledger.Detected,
			TolerationStartedAt: now, TolerationUntil: now.Add(tol), FindingIDs: head.FindingIDs,
			Detail: map[string]any{"message": head.Message, "gpus": head.GPUs, "toleration_seconds": tol.Seconds()},
		}
		w.Actor, w.Reason = Actor, head.Message
	}
	events, res, err := r.writeLedger(ctx, db, k, snap.Node.BootID, node, ds, w, now)
	if err != nil {
		return ledgerStep{}, fmt.Errorf("open repair on %s/%s: %w", k.Name(), node, err)
	}
	out.events = events
	if w.Open == nil {
		return out, nil
	}
	out.repair = res.Repair
	if res.Opened {
		r.EvaluateSoon() // a new condition diagnosis: the breakers see it before any deletion
		r.log.InfoContext(ctx, "repair opened", "cluster", k.Name(), "node", node, "repair", res.Repair.ID,
			"reason", head.Reason, "action", head.Action, "toleration", tol)
	}
	return out, nil
}

// quarantine sets the NodeCondition (False: not ready) and the NoSchedule taint.
func (r *Reconciler) quarantine(ctx context.Context, k *kube.Cluster, node string, head diagnose.Diagnosis, now time.Time, prior error) error {
	if prior != nil {
		return prior
	}
	if err := k.SetCondition(ctx, node, corev1.NodeCondition{Type: corev1.NodeConditionType(head.ConditionType),
		Status: corev1.ConditionFalse, Reason: head.Reason, Message: head.Message}, now); err != nil {
		return err
	}
	return k.SetQuarantine(ctx, node, true, head.Reason)
}

// ledgerRow is what decide.Step reads of a stored repair.
func ledgerRow(rp store.Repair) decide.Repair {
	heldBy, _ := rp.Detail["held_by"].(string)
	releasedBy, _ := rp.Detail["released_by"].(string)
	return decide.Repair{State: rp.State, NodeClaim: rp.NodeClaim, NodeClaimUID: rp.NodeClaimUID, DryRun: rp.DryRun,
		TolerationUntil: rp.TolerationUntil, HeldBy: heldBy, ReleasedBy: releasedBy, Since: rp.UpdatedAt}
}

// advance moves an open repair as far as it can go now: each round feeds
// decide.Step the ledger row, the headline diagnosis and the facts it
// needs, and carries out its answer. It returns the repair as it left it.
func (r *Reconciler) advance(ctx context.Context, k *kube.Cluster, info kube.NodeInfo, sn heldNode, rp store.Repair, head diagnose.Diagnosis, now time.Time) (store.Repair, error) {
	for i := 0; i < 6; i++ { // each step is one transition; bounded for safety
		row := ledgerRow(rp)
		f := decide.Facts{Action: r.effective(head, rp.NodePool).Action, NodeClaimUID: string(info.NodeClaimUID),
			ApprovalTTL: r.cfg.ApprovalTTL, Drain: r.takeRelease}
		if decide.NeedsBreakers(row) {
			ok, _, err := r.breakerAllows(ctx, sn)
			if err != nil {
				return rp, err
			}
			f.BreakerAllows = ok
			f.Resumed = func() (string, string, bool) { return r.resumeOf(ctx, sn, row.Since) }
		}
		next, err := r.carry(ctx, k, sn, rp, decide.Step(row, head, f, now), now)
		if err != nil {
			return rp, err
		}
		if next.State == rp.State {
			return next, nil
		}
		rp = next
	}
	return rp, nil
}

// carry carries out one decide.Next for repair rp.
func (r *Reconciler) carry(ctx context.Context, k *kube.Cluster, sn heldNode, rp store.Repair, next decide.Next, now time.Time) (store.Repair, error) {
	switch next.Kind {
	case decide.Transition:
		return r.step(ctx, rp, next, now)
	case decide.Guard:
		return r.execute(ctx, k, sn, rp, next, now)
	case decide.DeleteNodeClaim:
		return r.deleting(ctx, k, rp, now)
	}
	return rp, nil
}

// takeRelease takes one of this pass's paced releases of breaker-held repairs
// (DrainPerPass): the backlog drains paced, each repair re-validated on its
// way through Approved.
func (r *Reconciler) takeRelease() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.released >= r.cfg.DrainPerPass {
		return false // paced: the next pass releases more
	}
	r.released++
	return true
}

// step records the transition next (decide.Transition) of rp.
func (r *Reconciler) step(ctx context.Context, rp store.Repair, next decide.Next, now time.Time) (store.Repair, error) {
	var mutate func(*store.Repair)
	_, waiting := rp.Detail["waiting_on"]
	if len(next.Set) > 0 || next.ExecutedAction != "" || waiting {
		mutate = func(x *store.Repair) {
			delete(x.Detail, "waiting_on") // a new state: a hold is recorded again when it recurs (x.Detail is a copy)
			delete(x.Detail, "waiting_why")
			for k, v := range next.Set {
				x.Detail = with(x.Detail, k, v)
			}
			if next.ExecutedAction != "" {
				x.ExecutedAction = next.ExecutedAction
			}
		}
	}
	out, err := r.cfg.Store.Transition(ctx, store.TransitionRequest{ID: rp.ID, From: rp.State, To: next.To,
		Actor: Actor, Reason: next.Why, Detail: next.Detail, Mutate: mutate}, now)
	if errors.Is(err, store.ErrConflict) {
		return r.cfg.Store.GetRepair(ctx, rp.ID) // another replica moved it; continue from there
	}
	if err != nil {
		return rp, err
	}
	r.transitions.WithLabelValues(string(next.To)).Inc()
	r.tellTransition(out, next)
	r.log.InfoContext(ctx, "repair transition", "cluster", rp.Cluster, "node", rp.Node, "repair", rp.ID,
		"from", rp.State, "to", next.To, "why", next.Why)
	if r.crash("after-" + string(next.To)) {
		return out, ErrCrashed
	}
	return out, nil
}

// execute runs the deletion guards of a decide.Guard step in the store's
// guard transaction (BeginDeletion) and carries out decide.AfterGuard's
// answer. With Karpenter v1.14 the only executable action is NodeClaim
// replacement (docs/design.md, "Recommended versus executed action"):
// decide.Step sends a recommended reset or reboot to on-call before it
// gets here.
func (r *Reconciler) execute(ctx context.Context, k *kube.Cluster, sn heldNode, rp store.Repair, g decide.Next, now time.Time) (store.Repair, error) {
	guard := r.heldGuard(sn, rp, g.HumanApproved, now) // nil unless the breakers already hold the node
	for full := guard == nil; ; full = true {
		if full {
			var err error
			if guard, err = r.deletionGuard(ctx, k, sn, rp, g.HumanApproved, now); err != nil {
				return rp, fmt.Errorf("begin deletion of repair %d: %w", rp.ID, err)
			}
		}
		if r.crash("before-begin-deletion") {
			return rp, ErrCrashed
		}
		next, err := r.cfg.Store.BeginDeletion(ctx, rp.ID, rp.State, Actor, g.Why, now, guard)
		if !full && errors.Is(err, errGuardRecheck) {
			continue // the breakers let go meanwhile: every fact read, the guards run again
		}
		return r.afterGuard(ctx, k, rp, g, next, err, now)
	}
}

// afterGuard carries out decide.AfterGuard's answer to BeginDeletion's
// (next, err) for the Guard step g of repair rp.
func (r *Reconciler) afterGuard(ctx context.Context, k *kube.Cluster, rp store.Repair, g decide.Next, next store.Repair, err error, now time.Time) (store.Repair, error) {
	if errors.Is(err, store.ErrConflict) {
		return r.cfg.Store.GetRepair(ctx, rp.ID)
	}
	after, decided := decide.AfterGuard(g, err)
	if !decided {
		return rp, fmt.Errorf("begin deletion of repair %d: %w", rp.ID, err)
	}
	if err == nil {
		r.transitions.WithLabelValues(string(ledger.Deleting)).Inc()
		if r.crash("after-begin-deletion") {
			return next, ErrCrashed
		}
		return r.deleting(ctx, k, next, now)
	}
	switch {
	case errors.Is(err, decide.ErrMinHealthy):
		r.log.WarnContext(ctx, "repair held by the NodePool's minimum healthy count", "cluster", rp.Cluster, "node", rp.Node, "repair", rp.ID, "err", err)
	case errors.Is(err, decide.ErrBreakerStale):
		r.log.WarnContext(ctx, "repair waits for a fresh breaker evaluation", "cluster", rp.Cluster, "node", rp.Node, "repair", rp.ID, "err", err)
	case errors.Is(err, decide.ErrKillSwitch):
		r.log.WarnContext(ctx, "repair held by the kill switch", "cluster", rp.Cluster, "node", rp.Node, "repair", rp.ID)
	case errors.Is(err, decide.ErrBudgetExceeded):
		r.log.WarnContext(ctx, "repair held by budget", "cluster", rp.Cluster, "node", rp.Node, "repair", rp.ID, "err", err)
	case errors.Is(err, decide.ErrDoNotDisrupt), errors.Is(err, decide.ErrOptedOut):
		r.log.InfoContext(ctx, "repair held by the node's owners", "cluster", rp.Cluster, "node", rp.Node, "repair", rp.ID, "err", err)
	}
	if after.Retry == "breakers" {
		r.awaitBreakers(nodeKey{rp.Cluster, rp.Node})
		r.EvaluateSoon() // retried once the breakers are evaluated again
	}
	if after.Hold != "" {
		return rp, r.held(ctx, rp, after.Hold, err)
	}
	if after.Kind == decide.Transition {
		return r.step(ctx, rp, after, now)
	}
	return rp, nil // retried on the next pass
}

// with returns m with k=v set, copying m.
func with(m map[string]any, k string, v any) map[string]any {
	out := make(map[string]any, len(m)+1)
	for kk, vv := range m {
		out[kk] = vv
	}
	out[k] = v
	return out
}

// deleting issues the NodeClaim delete (idempotent) and closes the repair
// once the NodeClaim is gone; a dry-run repair is cancelled with nothing
// deleted (decide.Deleting).
func (r *Reconciler) deleting(ctx context.Context, k *kube.Cluster, rp store.Repair, now time.Time) (store.Repair, error) {
	row := ledgerRow(rp)
	if next := decide.Deleting(row); next.Kind == decide.Transition {
		return r.step(ctx, rp, next, now)
	}
	uid := types.UID(rp.NodeClaimUID)
	gone, err := k.NodeClaimGone(ctx, rp.NodeClaim, uid)
	if err != nil {
		return rp, err
	}
	if !gone {
		issued, err := k.DeleteNodeClaim(ctx, rp.NodeClaim, uid)
		if errors.Is(err, kube.ErrUIDChanged) {
			return r.step(ctx, rp, decide.UIDChanged(), now)
		}
		if err != nil {
			return rp, err
		}
		if r.crash("after-delete-call") {
			return rp, ErrCrashed
		}
		if issued {
			r.deletions.WithLabelValues(rp.Cluster, "false").Inc()
			r.tell(rp, kube.Event{Type: corev1.EventTypeNormal, Reason: ReasonNodeClaimDeleted, Action: ActionDeleteNodeClaim,
				Note: fmt.Sprintf("deleted NodeClaim %s (uid %s); Karpenter drains the node and launches its replacement", rp.NodeClaim, rp.NodeClaimUID)})
			r.log.InfoContext(ctx, "nodeclaim deleted", "cluster", rp.Cluster, "node", rp.Node, "nodeclaim", rp.NodeClaim, "repair", rp.ID)
		}
		if gone, err = k.NodeClaimGone(ctx, rp.NodeClaim, uid); err != nil {
			return rp, err
		}
		if !gone {
			if r.crash("waiting-replacement") {
				return rp, ErrCrashed
			}
			return rp, nil
		}
	}
	return r.step(ctx, rp, decide.Replaced(row), now)
}

// healthy handles a node without a condition diagnosis: nothing latches, the
// condition returns to True and the taint is removed; a repair not yet
// executing is resolved.
func (r *Reconciler) healthy(ctx context.Context, k *kube.Cluster, node string, head diagnose.Diagnosis, open store.Repair, hasOpen bool, now time.Time) error {
	if hasOpen && open.State == ledger.Deleting {
		_, err := r.deleting(ctx, k, open, now)
		return err
	}
	for _, t := range r.cfg.Engine.Catalog().ConditionTypes() {
		c, ok, err := k.Condition(ctx, node, corev1.NodeConditionType(t))
		if err != nil {
			return err
		}
		if ok && c.Status != corev1.ConditionTrue {
			if err := k.SetCondition(ctx, node, corev1.NodeCondition{Type: c.Type, Status: corev1.ConditionTrue,
				Reason: "NoFault", Message: "no active fault diagnosis for the current boot"}, now); err != nil {
				return err
			}
		}
	}
	if err := k.SetQuarantine(ctx, node, false, ""); err != nil {
		return err
	}
	if hasOpen {
		_, err := r.step(ctx, open, decide.Step(ledgerRow(open), head, decide.Facts{}, now), now)
		return err
	}
	return nil
}

// nodeGone closes a repair whose Node no longer exists.
func (r *Reconciler) nodeGone(ctx context.Context, k *kube.Cluster, rp store.Repair, now time.Time) error {
	if rp.State == ledger.Deleting {
		_, err := r.deleting(ctx, k, rp, now)
		return err
	}
	_, err := r.step(ctx, rp, decide.Step(ledgerRow(rp), diagnose.Diagnosis{}, decide.Facts{NodeGone: true}, now), now)
	return err
}
