package simulate

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/breaker"
)

// Result is the outcome of one scenario. Times are offsets from t0
// ("5m", "1h30m").
type Result struct {
	Scenario string `json:"scenario"`
	Nodes    int    `json:"nodes"`
	Duration string `json:"duration"`
	// Pass is true when every checkpoint and expectation holds and none
	// could not be evaluated.
	Pass bool `json:"pass"`
	// Checkpoints are the timeline's assertions, on fleetrepair's run.
	Checkpoints []Check `json:"checkpoints,omitempty"`
	// Expectations are the scenario-level breaker outcome (expect_trip,
	// cohort, max_deletions), on fleetrepair's run.
	Expectations []Check `json:"expectations,omitempty"`
	// Unevaluated repeats the checks the simulator could not evaluate.
	Unevaluated []Check `json:"unevaluated,omitempty"`
	// Halted lists change steps fleetrepair's run skipped because a
	// breaker halted the rollout.
	Halted   []Halted       `json:"haltedChanges,omitempty"`
	Policies []PolicyResult `json:"policies"`
}

// Policy returns the named policy's result, nil when it was not run.
func (r *Result) Policy(name string) *PolicyResult {
	for i := range r.Policies {
		if r.Policies[i].Policy == name {
			return &r.Policies[i]
		}
	}
	return nil
}

// PolicyResult is what one policy did on the timeline.
type PolicyResult struct {
	Policy string `json:"policy"`
	// Trips are breaker state changes: fleetrepair's cohort and ceiling
	// breakers with their evidence, NVSentinel's fleet breaker.
	Trips     []Trip     `json:"trips"`
	Deletions []Deletion `json:"deletions"`
	// Paused are repairs held by a breaker (Karpenter: NodeRepairBlocked)
	// or by the deletion budget.
	Paused []Pause `json:"paused"`
	// AwaitingApproval are fleetrepair repairs whose recommended action
	// (reset-gpu, reboot) is not executable: on-call decides.
	AwaitingApproval []Approval `json:"awaitingApproval,omitempty"`
	// Recovered are broken nodes fixed by a recover step of the timeline.
	Recovered  []Repaired   `json:"recovered,omitempty"`
	Unrepaired []Unrepaired `json:"unrepaired"`
	// Open are fleetrepair's repairs still open at the end, as the
	// controller's ledger would hold them.
	Open    []OpenRepair `json:"open,omitempty"`
	Notes   []string     `json:"notes,omitempty"`
	Summary Summary      `json:"summary"`
}

// Summary holds the comparison numbers of one policy.
type Summary struct {
	Trips     int `json:"trips"`
	Deletions int `json:"deletions"`
	// HealthyCauseDeleted counts deleted nodes whose hardware was fine:
	// their failure came from a shared cause (SharedCauseDeleted) or from
	// nothing at all, a monitor's false alarm (NoFaultDeleted). Deleting
	// them helps nothing.
	HealthyCauseDeleted int `json:"healthyCauseDeleted"`
	SharedCauseDeleted  int `json:"sharedCauseDeleted"`
	NoFaultDeleted      int `json:"noFaultDeleted"`
	// BrokenUnrepaired counts nodes with their own hardware fault still in
	// place at the end: neither replaced nor recovered.
	BrokenUnrepaired int `json:"brokenUnrepaired"`
	// LoneRepaired counts broken nodes the policy replaced, and
	// LoneTTRMeanSeconds / LoneTTRMaxSeconds their time from the first fault
	// to the NodeClaim deletion, in seconds. Remedies of the timeline's
	// recover steps are counted in RecoveredByTimeline instead.
	LoneRepaired        int     `json:"loneRepaired"`
	RecoveredByTimeline int     `json:"recoveredByTimeline"`
	LoneTTRMeanSeconds  float64 `json:"loneTTRMeanSeconds"`
	LoneTTRMaxSeconds   float64 `json:"loneTTRMaxSeconds"`
	// RepairsHeld counts repairs held at least once (by a breaker, a
	// baseline's rule or the budget).
	RepairsHeld int `json:"repairsHeld"`
}

// Trip is one breaker state change.
type Trip struct {
	At     string `json:"at"`
	Cohort string `json:"cohort"`
	// Change is the phase entered: open or closed.
	Change   string            `json:"change"`
	Cause    string            `json:"cause,omitempty"`
	Message  string            `json:"message"`
	Evidence *breaker.Evidence `json:"evidence,omitempty"`
}

// Deletion is one NodeClaim deletion.
type Deletion struct {
	Node   string `json:"node"`
	At     string `json:"at"`
	Reason string `json:"reason"`
	Action string `json:"action"`
	// Truth is the node's ground truth: broken, shared or no-fault.
	Truth        string `json:"truth"`
	TimeToRepair string `json:"timeToRepair,omitempty"`
}

// Pause is one held repair.
type Pause struct {
	Node    string `json:"node"`
	Since   string `json:"since"`
	Until   string `json:"until,omitempty"`
	By      string `json:"by"`
	Outcome string `json:"outcome,omitempty"`
}

// Approval is a repair parked for on-call approval because its recommended
// action is not executable with NodeClaim replacement.
type Approval struct {
	Node   string `json:"node"`
	At     string `json:"at"`
	Reason string `json:"reason"`
	Action string `json:"action"`
}

// Repaired is a broken node fixed by a recover step.
type Repaired struct {
	Node         string `json:"node"`
	At           string `json:"at"`
	Method       string `json:"method"`
	TimeToRepair string `json:"timeToRepair"`
}

// OpenRepair is a repair open at the end of a fleetrepair run.
type OpenRepair struct {
	Node string `json:"node"`
	// State is the ledger state (tolerating, awaiting_approval, approved).
	State string `json:"state"`
	// HeldBy is "breaker" or "action" while awaiting approval.
	HeldBy string `json:"heldBy,omitempty"`
	// Waiting: the toleration is over and the deletion budget delays it.
	Waiting bool `json:"waiting,omitempty"`
	// WaitingOn: the toleration is over and the node's owners hold the
	// deletion ("do-not-disrupt", "opt-out").
	WaitingOn string `json:"waitingOn,omitempty"`
}

// Unrepaired is a broken node still broken at the end.
type Unrepaired struct {
	Node        string `json:"node"`
	BrokenSince string `json:"brokenSince"`
	State       string `json:"state"`
}

// Halted is a change step (rollout wave) skipped because a breaker on the
// value it spreads is open.
type Halted struct {
	At      string            `json:"at"`
	Set     map[string]string `json:"set"`
	Breaker string            `json:"breaker"`
	Nodes   int               `json:"nodes"`
}

// Check statuses.
const (
	StatusPass        = "pass"
	StatusFail        = "fail"
	StatusUnevaluated = "unevaluated" // the simulator cannot evaluate this key
)

// Check is one evaluated assertion.
type Check struct {
	At     string `json:"at,omitempty"`
	Key    string `json:"key"`
	Want   any    `json:"want"`
	Got    any    `json:"got,omitempty"`
	Status string `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// WriteTable writes the comparison table of docs/breakers.md: per scenario
// and policy, the healthy-cause nodes deleted, the broken nodes left
// unrepaired and the time to repair lone failures (mean / max).
func WriteTable(w io.Writer, results []*Result) error {
	var b strings.Builder
	b.WriteString("| scenario | nodes | policy | trips | deletions | healthy-cause deleted | broken unrepaired | lone failures repaired | time to repair (mean / max) |\n")
	b.WriteString("|---|---:|---|---:|---:|---:|---:|---:|---|\n")
	for _, r := range results {
		for _, p := range r.Policies {
			s := p.Summary
			ttr := "-"
			if s.LoneRepaired > 0 {
				ttr = fmt.Sprintf("%s / %s", fmtOffset(seconds(s.LoneTTRMeanSeconds)), fmtOffset(seconds(s.LoneTTRMaxSeconds)))
			}
			fmt.Fprintf(&b, "| %s | %d | %s | %d | %d | %d | %d | %d | %s |\n", r.Scenario, r.Nodes, p.Policy, s.Trips,
				s.Deletions, s.HealthyCauseDeleted, s.BrokenUnrepaired, s.LoneRepaired, ttr)
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write comparison table: %w", err)
	}
	return nil
}

func seconds(s float64) time.Duration { return time.Duration(s) * time.Second }
