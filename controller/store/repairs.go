package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/decide"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
)

// Repair is one row of the repair ledger (docs/design.md, decision 6).
type Repair struct {
	ID           int64
	Cluster      string
	Node         string
	NodeClaim    string
	NodeClaimUID string // precondition of the NodeClaim delete
	NodePool     string
	Reason       string // reason code of the diagnosis that opened the repair
	FaultClass   string
	// RecommendedAction is what the diagnosis asked for (reset-gpu, reboot,
	// replace); ExecutedAction what was carried out (decision 6b).
	RecommendedAction string
	ExecutedAction    string
	State             ledger.State
	// DryRun repairs record everything and delete nothing.
	DryRun bool
	// TolerationStartedAt/TolerationUntil: the toleration clock (decision
	// 4); zero when not started.
	TolerationStartedAt time.Time
	TolerationUntil     time.Time
	CreatedAt           time.Time
	UpdatedAt           time.Time
	// ClosedAt is when the repair reached a terminal state; zero while open.
	ClosedAt time.Time
	// Detail holds what the repair learnt on the way (breaker that held it,
	// verification of the replacement, ...).
	Detail map[string]any
	// FindingIDs are the findings linked to the repair, sorted.
	FindingIDs []string
}

// AuditEntry is one transition of one repair. The audit is append-only.
type AuditEntry struct {
	ID       int64
	RepairID int64
	// From is "" for the entry that created the repair.
	From   ledger.State
	To     ledger.State
	Actor  string // "controller", or the on-call's identity
	Reason string
	Detail map[string]any
	At     time.Time
}

const (
	repairCols = `r.id, r.cluster, r.node, r.nodeclaim, r.nodeclaim_uid, r.nodepool, r.reason, r.fault_class,
r.recommended_action, r.executed_action, r.state, r.dry_run, r.toleration_started_at, r.toleration_until,
r.created_at, r.updated_at, r.closed_at, r.detail,
ARRAY(SELECT rf.finding_id FROM repair_findings rf WHERE rf.repair_id = r.id ORDER BY rf.finding_id)`

	// No conflict target: the only unique key an insert can hit is
	// repairs_one_open_per_node (ids come from the sequence). A concurrent
	// uncommitted opener makes this wait for its outcome.
	sqlInsertRepair = `
INSERT INTO repairs AS r (cluster, node, nodeclaim, nodeclaim_uid, nodepool, reason, fault_class,
                          recommended_action, executed_action, state, dry_run, toleration_started_at,
                          toleration_until, created_at, updated_at, detail)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $14, $15)
ON CONFLICT DO NOTHING
RETURNING r.id`

	sqlInsertAudit = `
INSERT INTO repair_audit (repair_id, from_state, to_state, actor, reason, detail, at)
VALUES ($1, $2, $3, $4, $5, $6, $7)`

	sqlLinkFindings = `
INSERT INTO repair_findings (repair_id, finding_id)
SELECT $1, id FROM unnest($2::text[]) AS t(id) WHERE id <> ''
ON CONFLICT DO NOTHING`

	sqlGetRepair          = `SELECT ` + repairCols + ` FROM repairs r WHERE r.id = $1`
	sqlGetRepairForUpdate = sqlGetRepair + ` FOR UPDATE OF r`
	sqlOpenRepairForNode  = `SELECT ` + repairCols + ` FROM repairs r
WHERE r.cluster = $1 AND r.node = $2 AND r.closed_at IS NULL`

	sqlUpdateRepair = `
UPDATE repairs r SET
    state = $3, updated_at = $4, closed_at = $5,
    nodeclaim = $6, nodeclaim_uid = $7, nodepool = $8, executed_action = $9,
    toleration_started_at = $10, toleration_until = $11, detail = $12
WHERE r.id = $1 AND r.state = $2
RETURNING ` + repairCols

	sqlRepairAudit = `
SELECT id, repair_id, from_state, to_state, actor, reason, detail, at
FROM repair_audit WHERE repair_id = $1 ORDER BY id`

	sqlRepairExists = `SELECT true FROM repairs WHERE id = $1`

	// A repair's findings are its node's (finding IDs are unique per node).
	// DISTINCT ON keeps the first received should one be stored twice.
	sqlRepairFindings = `
SELECT ` + findingCols + ` FROM (
    SELECT DISTINCT ON (f.id) f.* FROM repairs r
    JOIN repair_findings rf ON rf.repair_id = r.id
    JOIN findings f ON f.cluster = r.cluster AND f.node = r.node AND f.id = rf.finding_id
    WHERE r.id = $1
    ORDER BY f.id, f.received_at) linked
ORDER BY COALESCE(observed_at, received_at), id`

	sqlRepairsInState = `SELECT ` + repairCols + ` FROM repairs r WHERE r.state = ANY ($1::text[]) ORDER BY r.id`

	// The budget row lock (decision 7). FOR NO KEY UPDATE, not FOR UPDATE:
	// it serializes every deletion decision (and budget change) of the
	// cluster, but does not block the FOR KEY SHARE locks that foreign keys
	// take, so repairs and nodes of the cluster can still be inserted
	// meanwhile.
	sqlLockClusterBudget = `
SELECT deletions_per_hour, max_in_flight_per_nodepool, nodepool_deletions_per_hour FROM clusters WHERE name = $1 FOR NO KEY UPDATE`

	sqlNodePoolDeletionsSince = `
SELECT count(DISTINCT a.repair_id) FROM repair_audit a JOIN repairs r ON r.id = a.repair_id
WHERE a.to_state = 'deleting' AND a.from_state IS DISTINCT FROM 'deleting' AND a.at > $3
  AND r.cluster = $1 AND r.nodepool = $2 AND r.dry_run = $4`

	sqlRepairCluster = `SELECT cluster FROM repairs WHERE id = $1`

	// Repairs that entered deleting in the last hour. Counted from the
	// audit, so repairs that have since been replaced or failed still count.
	sqlDeletionsSince = `
SELECT count(DISTINCT a.repair_id) FROM repair_audit a JOIN repairs r ON r.id = a.repair_id
WHERE a.to_state = 'deleting' AND a.at > $2 AND r.cluster = $1 AND r.dry_run = $3`

	sqlInFlight = `
SELECT count(*) FROM repairs WHERE cluster = $1 AND nodepool = $2 AND state = 'deleting' AND dry_run = $3`
)

// OpenRepair opens a repair for r.Node: it inserts r in state r.State
// (Detected when empty; it must be an open state) with its creation audit
// entry (from "" to r.State, by actor, for reason) and links r.FindingIDs,
// all in one transaction, creating the cluster row if needed. When the node
// already has an open repair, it returns that one unchanged with created =
// false. Concurrent calls for one node are safe: the unique index on open
// repairs lets exactly one insert win, the others return the winner.
//
// Columns set from r: NodeClaim, NodeClaimUID, NodePool, Reason, FaultClass,
// RecommendedAction, ExecutedAction, DryRun, TolerationStartedAt,
// TolerationUntil, Detail, FindingIDs; ID and times come from the store.
func (s *Store) OpenRepair(ctx context.Context, r Repair, actor, reason string, now time.Time) (Repair, bool, error) {
	detail, err := checkOpenRepair(&r, actor)
	if err != nil {
		return Repair{}, false, err
	}
	// Three tries: the open repair we collided with can close between our
	// insert and our read of it; then the next insert succeeds.
	for try := 0; try < 3; try++ {
		var (
			out     Repair
			created bool
			found   bool
		)
		err := s.inTx(ctx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sqlEnsureCluster, r.Cluster, now); err != nil {
				return err
			}
			var id int64
			err := tx.QueryRow(ctx, sqlInsertRepair, r.Cluster, r.Node, r.NodeClaim, r.NodeClaimUID, r.NodePool,
				r.Reason, r.FaultClass, r.RecommendedAction, r.ExecutedAction, string(r.State), r.DryRun,
				nullTime(r.TolerationStartedAt), nullTime(r.TolerationUntil), now, detail).Scan(&id)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				// Lost to an open repair; read it (a new statement sees the
				// winner, committed by now).
				rows, _ := tx.Query(ctx, sqlOpenRepairForNode, r.Cluster, r.Node)
				out, err = pgx.CollectExactlyOneRow(rows, scanRepair)
				if errors.Is(err, pgx.ErrNoRows) {
					return nil // closed meanwhile: try again
				}
				found = err == nil
				return err
			case err != nil:
				return err
			}
			if _, err := tx.Exec(ctx, sqlInsertAudit, id, nil, string(r.State), actor, reason, []byte("{}"), now); err != nil {
				return err
			}
			if len(r.FindingIDs) > 0 {
				if _, err := tx.Exec(ctx, sqlLinkFindings, id, r.FindingIDs); err != nil {
					return err
				}
			}
			rows, _ := tx.Query(ctx, sqlGetRepair, id)
			out, err = pgx.CollectExactlyOneRow(rows, scanRepair)
			created, found = err == nil, err == nil
			return err
		})
		if err != nil {
			return Repair{}, false, errorf(err, "open repair on %s/%s", r.Cluster, r.Node)
		}
		if found {
			return out, created, nil
		}
	}
	return Repair{}, false, errorf(errors.New("the open repair kept changing"), "open repair on %s/%s", r.Cluster, r.Node)
}

// checkOpenRepair checks a repair to open (OpenRepair, WriteNodeLedger),
// defaulting its state to Detected, and returns its encoded Detail;
// ErrInvalid for a repair OpenRepair refuses.
func checkOpenRepair(r *Repair, actor string) ([]byte, error) {
	if r.State == "" {
		r.State = ledger.Detected
	}
	switch {
	case r.Cluster == "" || r.Node == "" || r.Reason == "":
		return nil, invalidf("open repair: cluster, node and reason are required")
	case actor == "":
		return nil, invalidf("open repair: actor is required")
	case !ledger.Valid(r.State) || ledger.Terminal(r.State):
		return nil, invalidf("open repair on %s/%s: state %q is not an open state", r.Cluster, r.Node, r.State)
	}
	detail, err := marshalOr(r.Detail, "{}")
	if err != nil {
		return nil, invalidf("open repair: encode detail")
	}
	return detail, nil
}

// TransitionRequest asks Transition to move repair ID from state From to
// state To.
type TransitionRequest struct {
	ID       int64
	From, To ledger.State
	// Actor and Reason go to the audit entry ("controller" or the on-call's
	// identity; why).
	Actor  string
	Reason string
	// Detail goes to the audit entry (numbers behind the decision).
	Detail map[string]any
	// Mutate, when set, is called with the current repair and may change
	// NodeClaim, NodeClaimUID, NodePool, ExecutedAction, TolerationStartedAt,
	// TolerationUntil and Detail; changes to other fields are ignored. It runs
	// inside the transaction, with the row locked: keep it fast, no I/O.
	Mutate func(*Repair)
}

// Transition moves a repair from t.From to t.To, compare-and-set: the state
// machine must allow the step (ledger.Check; else a *ledger.ErrTransition,
// also ErrInvalid), the repair must still be in t.From (else ErrConflict:
// someone else moved it; re-read), and it must exist (else ErrNotFound).
// ClosedAt is set when t.To is terminal. The audit entry is written in the
// same transaction. Returns the updated repair.
func (s *Store) Transition(ctx context.Context, t TransitionRequest, now time.Time) (Repair, error) {
	if err := ledger.Check(t.From, t.To); err != nil {
		return Repair{}, fmt.Errorf("transition repair %d: %w", t.ID, &dbError{kind: ErrInvalid, err: err})
	}
	if t.Actor == "" {
		return Repair{}, invalidf("transition repair %d: actor is required", t.ID)
	}
	var out Repair
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		out, err = transition(ctx, tx, t, now)
		return err
	})
	if err != nil {
		return Repair{}, errorf(err, "transition repair %d %s -> %s", t.ID, t.From, t.To)
	}
	return out, nil
}

// transition is Transition inside a transaction.
func transition(ctx context.Context, tx pgx.Tx, t TransitionRequest, now time.Time) (Repair, error) {
	rows, _ := tx.Query(ctx, sqlGetRepairForUpdate, t.ID)
	cur, err := pgx.CollectExactlyOneRow(rows, scanRepair)
	if err != nil {
		return Repair{}, err
	}
	if cur.State != t.From {
		return Repair{}, fmt.Errorf("repair is in state %s: %w", cur.State, ErrConflict)
	}
	next := cur
	if t.Mutate != nil {
		m := cur
		m.Detail = cloneMap(cur.Detail)
		t.Mutate(&m)
		next.NodeClaim, next.NodeClaimUID, next.NodePool = m.NodeClaim, m.NodeClaimUID, m.NodePool
		next.ExecutedAction, next.Detail = m.ExecutedAction, m.Detail
		next.TolerationStartedAt, next.TolerationUntil = m.TolerationStartedAt, m.TolerationUntil
	}
	detail, err := marshalOr(next.Detail, "{}")
	if err != nil {
		return Repair{}, invalidf("encode repair detail")
	}
	auditDetail, err := marshalOr(t.Detail, "{}")
	if err != nil {
		return Repair{}, invalidf("encode audit detail")
	}
	var closed *time.Time
	if ledger.Terminal(t.To) {
		closed = &now
	}
	rows, _ = tx.Query(ctx, sqlUpdateRepair, t.ID, string(t.From), string(t.To), now, closed,
		next.NodeClaim, next.NodeClaimUID, next.NodePool, next.ExecutedAction,
		nullTime(next.TolerationStartedAt), nullTime(next.TolerationUntil), detail)
	out, err := pgx.CollectExactlyOneRow(rows, scanRepair)
	if errors.Is(err, pgx.ErrNoRows) {
		return Repair{}, fmt.Errorf("repair left state %s: %w", t.From, ErrConflict)
	}
	if err != nil {
		return Repair{}, err
	}
	if _, err := tx.Exec(ctx, sqlInsertAudit, t.ID, string(t.From), string(t.To), t.Actor, t.Reason, auditDetail, now); err != nil {
		return Repair{}, err
	}
	return out, nil
}

// Budget names in a BudgetExceededError (controller/decide's).
const (
	BudgetDeletionsPerHour       = decide.BudgetDeletionsPerHour
	BudgetMaxInFlightPerNodePool = decide.BudgetMaxInFlightPerNodePool
	// BudgetNodePoolDeletionsPerHour: deletions in the NodePool in the last hour.
	BudgetNodePoolDeletionsPerHour = decide.BudgetNodePoolDeletionsPerHour
)

// DeletionBudget is the state of a cluster's deletion budgets as
// BeginDeletion saw it, with the cluster's budget row locked. Dry-run and
// real repairs are counted separately: a dry run shows what the budgets
// would allow without taking budget from real repairs.
type DeletionBudget struct {
	Cluster  string `json:"cluster"`
	NodePool string `json:"nodepool"`
	DryRun   bool   `json:"dry_run"`
	// DeletionsLastHour counts repairs that entered deleting in (now-1h, now].
	DeletionsLastHour int `json:"deletions_last_hour"`
	DeletionsPerHour  int `json:"deletions_per_hour"`
	// InFlight counts repairs of the NodePool in state deleting.
	InFlight               int `json:"in_flight"`
	MaxInFlightPerNodePool int `json:"max_in_flight_per_nodepool"`
	// NodePoolDeletionsLastHour counts the NodePool's repairs that entered
	// deleting in (now-1h, now].
	NodePoolDeletionsLastHour int `json:"nodepool_deletions_last_hour"`
	NodePoolDeletionsPerHour  int `json:"nodepool_deletions_per_hour"`
}

func (b DeletionBudget) auditDetail() map[string]any {
	return map[string]any{
		"cluster": b.Cluster, "nodepool": b.NodePool, "dry_run": b.DryRun,
		"deletions_last_hour": b.DeletionsLastHour, "deletions_per_hour": b.DeletionsPerHour,
		"in_flight": b.InFlight, "max_in_flight_per_nodepool": b.MaxInFlightPerNodePool,
		"nodepool_deletions_last_hour": b.NodePoolDeletionsLastHour, "nodepool_deletions_per_hour": b.NodePoolDeletionsPerHour,
	}
}

// BudgetExceededError says which deletion budget stopped a repair, with the
// numbers. errors.Is(err, ErrBudgetExceeded) is true for it.
type BudgetExceededError struct {
	RepairID int64
	// Budget is BudgetDeletionsPerHour or BudgetMaxInFlightPerNodePool.
	Budget string
	DeletionBudget
}

func (e *BudgetExceededError) Error() string {
	detail := e.Budget
	if ex := e.budget().Allows(e.counts()); ex != nil && ex.Budget == e.Budget {
		detail = ex.Detail
	}
	return detail + ": " + ErrBudgetExceeded.Error()
}

func (b DeletionBudget) budget() decide.Budget {
	return decide.Budget{DeletionsPerHour: b.DeletionsPerHour, MaxInFlightPerNodePool: b.MaxInFlightPerNodePool,
		NodePoolDeletionsPerHour: b.NodePoolDeletionsPerHour}
}

func (b DeletionBudget) counts() decide.Counts {
	return decide.Counts{Cluster: b.Cluster, NodePool: b.NodePool, DeletionsLastHour: b.DeletionsLastHour,
		InFlight: b.InFlight, NodePoolDeletionsLastHour: b.NodePoolDeletionsLastHour}
}

// Is makes errors.Is(err, ErrBudgetExceeded) true.
func (e *BudgetExceededError) Is(target error) bool { return target == ErrBudgetExceeded }

// DeletionGuard is a last check of BeginDeletion, run after the budgets
// passed while the cluster's budget row is locked (no other deletion in the
// cluster is being decided meanwhile). It must be a pure check on values:
// no I/O under the lock. It receives the repair as locked, the budget
// numbers, and the saved breaker state document read through the same
// transaction (nil when none was ever saved; see BreakerState); whatever
// else it needs (a Node list) the caller gathers before BeginDeletion. A
// non-nil error aborts the deletion, writes nothing, and is returned
// wrapped.
type DeletionGuard func(r Repair, b DeletionBudget, breakerState json.RawMessage) error

// BeginDeletion is the guard transaction of docs/design.md, decision 7. In one
// transaction it locks the cluster's budget row, checks that repair id is
// still in state from (else ErrConflict) and that from -> deleting is allowed,
// counts the repairs of the cluster that entered deleting in the last hour
// (against deletions_per_hour), those of the repair's NodePool now in
// deleting (against max_in_flight_per_nodepool) and those of the NodePool
// that entered deleting in the last hour (against
// nodepool_deletions_per_hour); reads the breaker state through the same
// transaction; runs the guards (pure checks, see DeletionGuard: the live
// controller's is decide.Deletion, which decides a breaker hold before the
// budgets); then decides the budgets by decide.Budget.Allows, whatever the
// guards allowed; and only then moves the repair to deleting with an
// audit entry whose detail holds the numbers. A spent budget returns a
// *BudgetExceededError (ErrBudgetExceeded) and writes nothing. Deciders on
// other replicas serialize on the lock, so two deletions cannot both take
// the last unit of a budget.
func (s *Store) BeginDeletion(ctx context.Context, id int64, from ledger.State, actor, reason string, now time.Time, guards ...DeletionGuard) (Repair, error) {
	if err := ledger.Check(from, ledger.Deleting); err != nil {
		return Repair{}, fmt.Errorf("begin deletion of repair %d: %w", id, &dbError{kind: ErrInvalid, err: err})
	}
	if actor == "" {
		return Repair{}, invalidf("begin deletion of repair %d: actor is required", id)
	}
	var out Repair
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var cluster string
		if err := tx.QueryRow(ctx, sqlRepairCluster, id).Scan(&cluster); err != nil {
			return err
		}
		b := DeletionBudget{Cluster: cluster}
		if err := tx.QueryRow(ctx, sqlLockClusterBudget, cluster).Scan(&b.DeletionsPerHour, &b.MaxInFlightPerNodePool, &b.NodePoolDeletionsPerHour); err != nil {
			return err
		}
		rows, _ := tx.Query(ctx, sqlGetRepairForUpdate, id)
		cur, err := pgx.CollectExactlyOneRow(rows, scanRepair)
		if err != nil {
			return err
		}
		if cur.State != from {
			return fmt.Errorf("repair is in state %s: %w", cur.State, ErrConflict)
		}
		b.NodePool, b.DryRun = cur.NodePool, cur.DryRun
		if err := tx.QueryRow(ctx, sqlDeletionsSince, cluster, now.Add(-time.Hour), cur.DryRun).Scan(&b.DeletionsLastHour); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, sqlInFlight, cluster, cur.NodePool, cur.DryRun).Scan(&b.InFlight); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, sqlNodePoolDeletionsSince, cluster, cur.NodePool, now.Add(-time.Hour), cur.DryRun).Scan(&b.NodePoolDeletionsLastHour); err != nil {
			return err
		}
		if len(guards) > 0 {
			var doc []byte
			err := tx.QueryRow(ctx, sqlGetBreakerState).Scan(&doc, new(int64))
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			for _, g := range guards {
				if err := g(cur, b, doc); err != nil {
					return fmt.Errorf("guard: %w", err)
				}
			}
		}
		// After the guards, which decide a breaker hold before the budgets
		// (decide.Deletion): the budgets hold whatever the guards allowed.
		if ex := b.budget().Allows(b.counts()); ex != nil {
			return &BudgetExceededError{RepairID: id, Budget: ex.Budget, DeletionBudget: b}
		}
		out, err = transition(ctx, tx, TransitionRequest{
			ID: id, From: from, To: ledger.Deleting, Actor: actor, Reason: reason, Detail: b.auditDetail(),
		}, now)
		return err
	})
	if err != nil {
		return Repair{}, errorf(err, "begin deletion of repair %d", id)
	}
	return out, nil
}

// GetRepair returns repair id, or ErrNotFound.
func (s *Store) GetRepair(ctx context.Context, id int64) (Repair, error) {
	rows, _ := s.pool.Query(ctx, sqlGetRepair, id)
	r, err := pgx.CollectExactlyOneRow(rows, scanRepair)
	if err != nil {
		return Repair{}, errorf(err, "get repair %d", id)
	}
	return r, nil
}

// OpenRepairForNode returns the node's open repair, or ErrNotFound.
func (s *Store) OpenRepairForNode(ctx context.Context, cluster, node string) (Repair, error) {
	rows, _ := s.pool.Query(ctx, sqlOpenRepairForNode, cluster, node)
	r, err := pgx.CollectExactlyOneRow(rows, scanRepair)
	if err != nil {
		return Repair{}, errorf(err, "get open repair of %s/%s", cluster, node)
	}
	return r, nil
}

// RepairAudit returns the audit trail of repair id in the order it was
// written (the creation entry first), or ErrNotFound.
func (s *Store) RepairAudit(ctx context.Context, id int64) ([]AuditEntry, error) {
	rows, _ := s.pool.Query(ctx, sqlRepairAudit, id)
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (AuditEntry, error) {
		var (
			a    AuditEntry
			from *string
		)
		err := row.Scan(&a.ID, &a.RepairID, &from, &a.To, &a.Actor, &a.Reason, &a.Detail, &a.At)
		if from != nil {
			a.From = ledger.State(*from)
		}
		if len(a.Detail) == 0 {
			a.Detail = nil
		}
		a.At = a.At.UTC()
		return a, err
	})
	if err != nil {
		return nil, errorf(err, "read audit of repair %d", id)
	}
	if len(out) == 0 { // every repair has its creation entry
		return nil, errorf(pgx.ErrNoRows, "read audit of repair %d", id)
	}
	return out, nil
}

// RepairFindings returns the stored findings linked to repair id, ordered by
// when they happened; links to findings dropped by retention are skipped.
func (s *Store) RepairFindings(ctx context.Context, id int64) ([]finding.Finding, error) {
	rows, _ := s.pool.Query(ctx, sqlRepairFindings, id)
	out, err := pgx.CollectRows(rows, scanFinding)
	if err != nil {
		return nil, errorf(err, "read findings of repair %d", id)
	}
	return out, nil
}

// RepairsInState returns every repair in one of states, oldest first; no
// states means every open state (ledger.OpenStates). An unknown state is
// ErrInvalid.
func (s *Store) RepairsInState(ctx context.Context, states ...ledger.State) ([]Repair, error) {
	if len(states) == 0 {
		states = ledger.OpenStates()
	}
	names := make([]string, len(states))
	for i, st := range states {
		if !ledger.Valid(st) {
			return nil, invalidf("list repairs: unknown state %q", st)
		}
		names[i] = string(st)
	}
	rows, _ := s.pool.Query(ctx, sqlRepairsInState, names)
	out, err := pgx.CollectRows(rows, scanRepair)
	if err != nil {
		return nil, errorf(err, "list repairs in states %v", names)
	}
	return out, nil
}

// RepairFilter selects repairs for ListRepairs; zero fields do not filter.
type RepairFilter struct {
	Cluster, Node, Reason string
	State                 ledger.State
	// Since (inclusive) and Until (exclusive) bound CreatedAt.
	Since, Until time.Time
	// Cursor continues a listing: only repairs with ID < Cursor (the next
	// value of the previous page).
	Cursor int64
	// Limit is the page size: <= 0 means DefaultListLimit, at most
	// MaxListLimit.
	Limit int
}

// Page sizes of ListRepairs.
const (
	DefaultListLimit = 50
	MaxListLimit     = 500
)

// ListRepairs returns one page of the repairs matching f, newest (highest ID)
// first, and the cursor of the next page (0 when this is the last).
// Pagination is by keyset on the ID, so pages stay stable while new repairs
// are opened.
func (s *Store) ListRepairs(ctx context.Context, f RepairFilter) (repairs []Repair, next int64, err error) {
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultListLimit
	}
	if limit > MaxListLimit {
		limit = MaxListLimit
	}
	if f.State != "" && !ledger.Valid(f.State) {
		return nil, 0, invalidf("list repairs: unknown state %q", f.State)
	}
	var (
		where []string
		args  []any
	)
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, strings.ReplaceAll(cond, "?", "$"+strconv.Itoa(len(args))))
	}
	if f.Cluster != "" {
		add("r.cluster = ?", f.Cluster)
	}
	if f.Node != "" {
		add("r.node = ?", f.Node)
	}
	if f.State != "" {
		add("r.state = ?", string(f.State))
	}
	if f.Reason != "" {
		add("r.reason = ?", f.Reason)
	}
	if !f.Since.IsZero() {
		add("r.created_at >= ?", f.Since)
	}
	if !f.Until.IsZero() {
		add("r.created_at < ?", f.Until)
	}
	if f.Cursor > 0 {
		add("r.id < ?", f.Cursor)
	}
	q := "SELECT " + repairCols + " FROM repairs r"
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	args = append(args, limit+1) // one more tells whether a next page exists
	q += " ORDER BY r.id DESC LIMIT $" + strconv.Itoa(len(args))

	rows, _ := s.pool.Query(ctx, q, args...)
	repairs, err = pgx.CollectRows(rows, scanRepair)
	if err != nil {
		return nil, 0, errorf(err, "list repairs")
	}
	if len(repairs) > limit {
		repairs = repairs[:limit]
		next = repairs[limit-1].ID
	}
	return repairs, next, nil
}

func scanRepair(row pgx.CollectableRow) (Repair, error) {
	var (
		r                          Repair
		state                      string
		tolStart, tolUntil, closed *time.Time
	)
	err := row.Scan(&r.ID, &r.Cluster, &r.Node, &r.NodeClaim, &r.NodeClaimUID, &r.NodePool, &r.Reason,
		&r.FaultClass, &r.RecommendedAction, &r.ExecutedAction, &state, &r.DryRun, &tolStart, &tolUntil,
		&r.CreatedAt, &r.UpdatedAt, &closed, &r.Detail, &r.FindingIDs)
	if err != nil {
		return r, err
	}
	r.State = ledger.State(state)
	r.TolerationStartedAt, r.TolerationUntil, r.ClosedAt = fromNull(tolStart), fromNull(tolUntil), fromNull(closed)
	r.CreatedAt, r.UpdatedAt = r.CreatedAt.UTC(), r.UpdatedAt.UTC()
	if len(r.Detail) == 0 {
		r.Detail = nil
	}
	if len(r.FindingIDs) == 0 {
		r.FindingIDs = nil
	}
	return r, nil
}

func cloneMap(m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

const (
	sqlNoteRepair = `
UPDATE repairs SET detail = detail || $2::jsonb, updated_at = $3 WHERE id = $1
RETURNING state`
)

// NoteRepair records a fact learnt about a repair without changing its
// state (the replacement's verification, for example): detail is merged
// into the repair's detail and an audit entry from and to the current state
// is appended, in one transaction. ErrNotFound when there is no such repair.
func (s *Store) NoteRepair(ctx context.Context, id int64, actor, reason string, detail map[string]any, now time.Time) error {
	if actor == "" {
		return invalidf("note repair %d: actor is required", id)
	}
	doc, err := marshalOr(detail, "{}")
	if err != nil {
		return invalidf("note repair %d: encode detail", id)
	}
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		var state string
		if err := tx.QueryRow(ctx, sqlNoteRepair, id, doc, now.UTC()).Scan(&state); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sqlInsertAudit, id, state, state, actor, reason, doc, now.UTC())
		return err
	})
	if err != nil {
		return errorf(err, "note repair %d", id)
	}
	return nil
}
