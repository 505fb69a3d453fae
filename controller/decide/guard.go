package decide

import (
	"errors"
	"fmt"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/breaker"
)

// Budget names, as the ledger's audit, the shadow report and the API use
// them.
const (
	// BudgetDeletionsPerHour: the cluster's deletions in the last hour.
	BudgetDeletionsPerHour = "deletions_per_hour"
	// BudgetMaxInFlightPerNodePool: the NodePool's deletions in flight.
	BudgetMaxInFlightPerNodePool = "max_in_flight_per_nodepool"
	// BudgetNodePoolDeletionsPerHour: the NodePool's deletions in the last hour.
	BudgetNodePoolDeletionsPerHour = "nodepool_deletions_per_hour"
	// BudgetMinHealthy: the NodePool's healthy nodes against the policy
	// file's minHealthy.
	BudgetMinHealthy = "nodepool_min_healthy"
)

// Budget is a cluster's deletion budgets (the clusters table's columns)
// and the NodePool's minimum healthy count (policy file; 0: none).
type Budget struct {
	DeletionsPerHour         int
	MaxInFlightPerNodePool   int
	NodePoolDeletionsPerHour int
	MinHealthy               int
}

// Counts is what the budgets are checked against, for one repair's
// cluster and NodePool at one time.
type Counts struct {
	Cluster, NodePool string
	// DeletionsLastHour: the cluster's repairs that entered deleting in
	// (now-1h, now]. InFlight: the NodePool's deletions not finished.
	// NodePoolDeletionsLastHour: the NodePool's repairs that entered
	// deleting in (now-1h, now].
	DeletionsLastHour, InFlight, NodePoolDeletionsLastHour int
	// Healthy is the NodePool's healthy nodes (live: Ready and not
	// quarantined); only read when Budget.MinHealthy > 0.
	Healthy int
}

// Exceeded says which budget refused a deletion and with which numbers.
type Exceeded struct {
	Budget string // one of the Budget* names
	Detail string // "cluster c1: 10 deletions in the last hour, budget 10 per hour"
}

// ErrBudgetExceeded is what every refusal by a rate or in-flight budget
// is (errors.Is), whoever returns it (store.BudgetExceededError too).
var ErrBudgetExceeded = errors.New("repair budget exceeded")

// ErrMinHealthy is returned (wrapped) by Deletion when the NodePool has
// fewer healthy nodes than its minimum.
var ErrMinHealthy = errors.New("NodePool below its minimum healthy count")

// Allows checks the rate and in-flight budgets, in the order the ledger
// has always checked them: the cluster's deletions per hour, the
// NodePool's deletions in flight, the NodePool's deletions per hour. It
// returns nil when all allow one more deletion. The minimum healthy count
// is checked by Deletion after the breakers (AllowsHealthy), so a repair
// a breaker holds goes to on-call rather than waiting for capacity.
func (b Budget) Allows(c Counts) *Exceeded {
	switch {
	case c.DeletionsLastHour >= b.DeletionsPerHour:
		return &Exceeded{Budget: BudgetDeletionsPerHour, Detail: fmt.Sprintf("cluster %s: %d deletions in the last hour, budget %d per hour",
			c.Cluster, c.DeletionsLastHour, b.DeletionsPerHour)}
	case c.InFlight >= b.MaxInFlightPerNodePool:
		return &Exceeded{Budget: BudgetMaxInFlightPerNodePool, Detail: fmt.Sprintf("cluster %s nodepool %q: %d deletions in flight, budget %d",
			c.Cluster, c.NodePool, c.InFlight, b.MaxInFlightPerNodePool)}
	case c.NodePoolDeletionsLastHour >= b.NodePoolDeletionsPerHour:
		return &Exceeded{Budget: BudgetNodePoolDeletionsPerHour, Detail: fmt.Sprintf("cluster %s nodepool %q: %d deletions in the last hour, budget %d per hour",
			c.Cluster, c.NodePool, c.NodePoolDeletionsLastHour, b.NodePoolDeletionsPerHour)}
	}
	return nil
}

// AllowsHealthy checks the minimum healthy count: nil when MinHealthy is
// 0 or the NodePool has at least that many healthy nodes.
func (b Budget) AllowsHealthy(c Counts) *Exceeded {
	if b.MinHealthy <= 0 || c.Healthy >= b.MinHealthy {
		return nil
	}
	return &Exceeded{Budget: BudgetMinHealthy, Detail: fmt.Sprintf("NodePool %s has %d healthy nodes, minimum %d", c.NodePool, c.Healthy, b.MinHealthy)}
}

// BudgetError is a budget refusal returned by Deletion.
type BudgetError struct{ Exceeded }

func (e *BudgetError) Error() string {
	if e.Budget == BudgetMinHealthy {
		return e.Detail + ": " + ErrMinHealthy.Error()
	}
	return e.Detail + ": " + ErrBudgetExceeded.Error()
}

// Is makes errors.Is(err, ErrMinHealthy) true for the minimum healthy
// count, errors.Is(err, ErrBudgetExceeded) for the other budgets.
func (e *BudgetError) Is(target error) bool {
	if e.Budget == BudgetMinHealthy {
		return target == ErrMinHealthy
	}
	return target == ErrBudgetExceeded
}

// Errors of the breaker guard.
var (
	// ErrKillSwitch: the kill switch stops every deletion, approved ones
	// included.
	ErrKillSwitch = errors.New("the kill switch stops every repair")
	// ErrHeldByBreaker: a cohort breaker (or the fleet ceiling) holds the
	// node; the repair goes to on-call.
	ErrHeldByBreaker = errors.New("held by a breaker")
	// ErrBreakerStale: the breaker state is older than MaxBreakerAge (or
	// was never evaluated); the deletion is retried after the next
	// evaluation, never held.
	ErrBreakerStale = errors.New("breaker state too old to decide on")
)

// Guards are the facts the deletion guards decide on, gathered by the
// caller before it decides (live: the Node list before the guard
// transaction, the budget counts and the breaker state read through it).
type Guards struct {
	Budget Budget
	Counts Counts
	// Breakers is true when breakers are configured; State is the saved
	// breaker state (the zero State when none was saved: never evaluated).
	Breakers bool
	State    breaker.State
	// Node is the node under repair as the breakers know it.
	Node breaker.Node
	// HumanApproved: an on-call approval overrides the cohort breakers and
	// the fleet ceiling for its repair, never the kill switch, the budgets
	// or the minimum healthy count.
	HumanApproved bool
	// MaxBreakerAge is the oldest breaker evaluation acted on; 0 skips the
	// check (a replay evaluates the breakers at every pass by construction).
	MaxBreakerAge time.Duration
	// Disruption is the owners' word on disrupting the node (opt-out,
	// do-not-disrupt).
	Disruption Disruption
}

// Deletion runs the deletion guards on g at now, in order: the kill switch
// (ErrKillSwitch), the owners' opt-out (ErrOptedOut) and do-not-disrupt
// (ErrDoNotDisrupt), then unless a human approved the repair and when
// breakers are on, the freshness of the breaker state (ErrBreakerStale)
// and breaker.Allows (ErrHeldByBreaker, naming the cohort and its
// numbers), then the budgets (Budget.Allows: a *BudgetError), and last the
// NodePool's minimum healthy count (a *BudgetError that is ErrMinHealthy).
// The breakers come before the budgets and the minimum healthy count so
// that every repair a breaker holds goes to on-call at once: in a zone
// wave the approval queue shows the whole cohort, not only the repairs
// that found budget left (docs/design.md "The breakers before the
// budgets"). nil means the NodeClaim may be deleted now. Errors wrap the
// sentinels.
func Deletion(g Guards, now time.Time) error {
	if ks := g.State.KillSwitch; ks.On {
		return fmt.Errorf("kill switch on since %s by %s (%s): %w", ks.Since.Format(time.RFC3339), ks.Actor, ks.Reason, ErrKillSwitch)
	}
	if err := g.Disruption.check(); err != nil {
		return err // no approval overrides the owners (disruption.go)
	}
	if g.Breakers && !g.HumanApproved {
		if err := Fresh(g.State, g.MaxBreakerAge, now); err != nil {
			return err
		}
		if ok, why := breaker.Allows(g.State, g.Node); !ok {
			return fmt.Errorf("%s: %w", why, ErrHeldByBreaker)
		}
	}
	if ex := g.Budget.Allows(g.Counts); ex != nil {
		return &BudgetError{*ex}
	}
	if ex := g.Budget.AllowsHealthy(g.Counts); ex != nil {
		return &BudgetError{*ex}
	}
	return nil
}

// BreakerHolds reports whether the breakers hold g.Node's deletion on
// g.State at now, whatever g.Disruption and g.Counts.Healthy say: breakers
// on, no human approval, the kill switch off, the state fresh (Fresh) and
// breaker.Allows refusing the node. Deletion on such g never returns nil
// (an owner's hold or ErrHeldByBreaker), so a caller that knows
// this may decide on the owners' word it has recorded instead of reading
// it again (the live guard in a zone wave: no Pod list and NodePool read
// per held repair; the shadow report always decides on the recorded word).
// It only ever tells a caller it may skip reads for a refusal; nothing may
// be allowed on it.
func BreakerHolds(g Guards, now time.Time) bool {
	if !g.Breakers || g.HumanApproved || g.State.KillSwitch.On || Fresh(g.State, g.MaxBreakerAge, now) != nil {
		return false
	}
	ok, _ := breaker.Allows(g.State, g.Node)
	return !ok
}

// Fresh returns an ErrBreakerStale error unless st was evaluated within
// maxAge of now; maxAge 0 accepts any evaluation.
func Fresh(st breaker.State, maxAge time.Duration, now time.Time) error {
	if maxAge <= 0 {
		return nil
	}
	if st.EvaluatedAt.IsZero() {
		return fmt.Errorf("breakers not evaluated yet: %w", ErrBreakerStale)
	}
	if age := now.Sub(st.EvaluatedAt); age > maxAge {
		return fmt.Errorf("breakers last evaluated %s ago (at %s), bound %s: %w", age.Round(time.Millisecond),
			st.EvaluatedAt.Format(time.RFC3339), maxAge, ErrBreakerStale)
	}
	return nil
}
