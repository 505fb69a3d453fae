package lifecycle

import (
	"fmt"
	"sort"
	"time"

	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// State is where a NodeClaim stands in Karpenter's lifecycle, as
// Classify reads it. It is never a health verdict: no state opens a
// repair, and none is a reason to delete a NodeClaim or touch its
// finalizers (Karpenter owns them). States decide only what counts as
// capacity (Capacity) and as a breaker cohort member (BreakerMember), and
// what an operator is shown (the fleetrepair_nodeclaims gauge,
// GET /api/v1/clusters/{cluster}/nodeclaims, the fleet page).
type State string

// States, in the order Classify tests them.
const (
	// Terminating: deletion requested (deletionTimestamp on the NodeClaim
	// or its Node), within the termination grace: Karpenter is draining it.
	StateTerminating State = "terminating"
	// StuckTerminating: deletion requested longer ago than the termination
	// grace (c27: a week, held by karpenter.sh/termination). A human checks
	// the instance (by providerID) and the finalizer; nothing is deleted
	// again and no finalizer is removed.
	StateStuckTerminating State = "stuck-terminating"
	// Launching: not registered yet, within the registration grace.
	StateLaunching State = "launching"
	// NotRegistered: no Node registered within the registration grace
	// (c23). Karpenter's registration TTL should have removed it.
	StateNotRegistered State = "not-registered"
	// NoNode: registered once, but its Node object is gone.
	StateNoNode State = "no-node"
	// Initializing: registered, not initialized yet, within the
	// initialization grace (startup taints, resources, device plugin).
	StateInitializing State = "initializing"
	// NotInitialized: registered, Initialized not True past the grace.
	StateNotInitialized State = "not-initialized"
	// Drifted: Karpenter found it drifted and will replace it in its own
	// disruption budget; until then it serves pods (capacity).
	StateDrifted State = "drifted"
	// Active: launched, registered, initialized, not drifted, not deleting.
	StateActive State = "active"
)

// States lists every State, for gauges and query validation.
func States() []State {
	return []State{StateActive, StateDrifted, StateLaunching, StateInitializing, StateTerminating, StateStuckTerminating, StateNotRegistered, StateNoNode, StateNotInitialized}
}

// Stuck reports whether a state is one an operator must look at: a
// NodeClaim that outlived its grace in a transitional state.
func (s State) Stuck() bool {
	switch s {
	case StateStuckTerminating, StateNotRegistered, StateNoNode, StateNotInitialized:
		return true
	}
	return false
}

// Capacity reports whether a node in this state is healthy capacity when
// it is otherwise healthy (Ready, not quarantined): active and drifted
// nodes serve pods; leaving, launching and uninitialized ones do not.
func (s State) Capacity() bool { return s == StateActive || s == StateDrifted }

// BreakerMember reports whether a node in this state is a member of the
// breakers' fleet (their denominators). Capacity is; a leaving node never is
// (c27: week-old terminating nodes inflate a cohort and can block real
// repairs); a node not yet initialized is one only while it is failing
// (a replacement that comes up with the fault it replaced counts against
// its cohort, c28), so idle uninitialized NodeClaims dilute no failure rate.
func (s State) BreakerMember(failing bool) bool {
	switch {
	case s.Capacity():
		return true
	case s == StateTerminating || s == StateStuckTerminating:
		return false
	}
	return failing
}

// Graces are how long a NodeClaim may stay in a transitional state before
// it is stuck.
type Graces struct {
	// Registration: from creation to Registered (default 20m: Karpenter's
	// registration TTL of 15m, plus a margin, so a claim Karpenter failed
	// to remove is shown, not one it is about to).
	Registration time.Duration
	// Initialization: from Registered to Initialized (default 15m).
	Initialization time.Duration
	// Termination: from the deletionTimestamp, when the NodeClaim sets no
	// terminationGracePeriod (default 1h); with one, that period plus
	// TerminationMargin.
	Termination       time.Duration
	TerminationMargin time.Duration // default 15m
}

// DefaultGraces returns the default Graces.
func DefaultGraces() Graces {
	return Graces{Registration: 20 * time.Minute, Initialization: 15 * time.Minute, Termination: time.Hour, TerminationMargin: 15 * time.Minute}
}

func (g Graces) withDefaults() Graces {
	d := DefaultGraces()
	if g.Registration <= 0 {
		g.Registration = d.Registration
	}
	if g.Initialization <= 0 {
		g.Initialization = d.Initialization
	}
	if g.Termination <= 0 {
		g.Termination = d.Termination
	}
	if g.TerminationMargin <= 0 {
		g.TerminationMargin = d.TerminationMargin
	}
	return g
}

// Condition is one NodeClaim status condition: Status True, False,
// Unknown, or "" when the NodeClaim does not carry it.
type Condition struct {
	Status string
	Since  time.Time // lastTransitionTime
	Reason string
}

// Facts are what Classify reads of a NodeClaim (FactsOf); the zero Facts
// (Name "") is "no NodeClaim".
type Facts struct {
	Name       string
	UID        string
	NodePool   string // karpenter.sh/nodepool label
	NodeName   string // status.nodeName
	ProviderID string // status.providerID
	Created    time.Time
	// Deleting is the deletionTimestamp; zero while not deleting.
	Deleting   time.Time
	Finalizers []string
	// TerminationGracePeriod is spec.terminationGracePeriod, 0 when unset.
	TerminationGracePeriod            time.Duration
	Launched, Registered, Initialized Condition
	Drifted                           bool
}

// FactsOf reads a NodeClaim's lifecycle facts. A Registered or Initialized
// condition the status does not carry is read from the karpenter.sh
// registered / initialized labels when they are set ("true": True).
func FactsOf(nc *karpv1.NodeClaim) Facts {
	f := Facts{Name: nc.Name, UID: string(nc.UID), NodePool: nc.Labels[karpv1.NodePoolLabelKey], NodeName: nc.Status.NodeName,
		ProviderID: nc.Status.ProviderID, Created: nc.CreationTimestamp.Time, Finalizers: nc.Finalizers}
	if nc.DeletionTimestamp != nil {
		f.Deleting = nc.DeletionTimestamp.Time
	}
	if p := nc.Spec.TerminationGracePeriod; p != nil {
		f.TerminationGracePeriod = p.Duration
	}
	// The status's own conditions, not StatusConditions().Get, which makes
	// up an Unknown "AwaitingReconciliation" for one the object lacks.
	get := func(typ, label string) Condition {
		for _, c := range nc.Status.Conditions {
			if c.Type == typ {
				return Condition{Status: string(c.Status), Since: c.LastTransitionTime.Time, Reason: c.Reason}
			}
		}
		if nc.Labels[label] == "true" {
			return Condition{Status: "True"}
		}
		return Condition{}
	}
	f.Launched = get(karpv1.ConditionTypeLaunched, "")
	f.Registered = get(karpv1.ConditionTypeRegistered, karpv1.NodeRegisteredLabelKey)
	f.Initialized = get(karpv1.ConditionTypeInitialized, karpv1.NodeInitializedLabelKey)
	for _, c := range nc.Status.Conditions {
		if c.Type == karpv1.ConditionTypeDrifted && c.Status == "True" {
			f.Drifted = true
		}
	}
	return f
}

// Claim is one NodeClaim's classified lifecycle, as the API and the
// dashboard show it.
type Claim struct {
	Cluster    string   `json:"cluster"`
	Name       string   `json:"name"`
	NodePool   string   `json:"nodepool,omitempty"`
	Node       string   `json:"node,omitempty"` // status.nodeName, "" before registration
	ProviderID string   `json:"providerID,omitempty"`
	State      State    `json:"state"`
	Stuck      bool     `json:"stuck"`
	Finalizers []string `json:"finalizers,omitempty"`
	// Since is when the NodeClaim entered State (deletionTimestamp,
	// creation, Registered's transition); For how long, at classification.
	Since time.Time `json:"since"`
	For   string    `json:"for"`
	// Detail says why, in words ("deletion pending 7d 2h, past the
	// termination grace of 1h; finalizers karpenter.sh/termination").
	Detail string `json:"detail"`
}

// Classify returns the lifecycle state of a NodeClaim at now: deleting
// first (the NodeClaim's deletionTimestamp, or nodeDeleting, its Node's),
// then registration, the Node's existence (nodeExists), initialization and
// drift. A condition the NodeClaim does not carry (old objects, simulated
// ones) never makes it stuck: unknown is not a verdict.
func Classify(f Facts, nodeExists bool, nodeDeleting time.Time, now time.Time, g Graces) Claim {
	g = g.withDefaults()
	c := Claim{Name: f.Name, NodePool: f.NodePool, Node: f.NodeName, ProviderID: f.ProviderID, Finalizers: f.Finalizers}
	set := func(s State, since time.Time, detail string) Claim {
		c.State, c.Since, c.Stuck, c.Detail = s, since.UTC(), s.Stuck(), detail
		if !since.IsZero() && now.After(since) {
			c.For = Age(now.Sub(since))
		}
		return c
	}
	deleting := f.Deleting // the earlier of the two deletion requests
	if !nodeDeleting.IsZero() && (deleting.IsZero() || nodeDeleting.Before(deleting)) {
		deleting = nodeDeleting
	}
	if !deleting.IsZero() {
		grace, why := g.Termination, "the termination grace"
		if f.TerminationGracePeriod > 0 {
			grace, why = f.TerminationGracePeriod+g.TerminationMargin, "its terminationGracePeriod plus a margin"
		}
		pending := now.Sub(deleting)
		detail := fmt.Sprintf("deletion pending %s; finalizers %v", Age(pending), f.Finalizers)
		if pending > grace {
			return set(StateStuckTerminating, deleting, fmt.Sprintf("%s, past %s (%s): check the instance %q and the finalizer; fleetrepair deletes nothing again and removes no finalizer",
				detail, why, Age(grace), f.ProviderID))
		}
		return set(StateTerminating, deleting, detail)
	}
	switch f.Registered.Status {
	case "False", "Unknown":
		if age := now.Sub(f.Created); age > g.Registration {
			return set(StateNotRegistered, f.Created, fmt.Sprintf("no Node registered %s after launch (grace %s); Registered=%s %s",
				Age(age), Age(g.Registration), f.Registered.Status, f.Registered.Reason))
		}
		return set(StateLaunching, f.Created, "waiting for its Node to register")
	}
	if !nodeExists {
		if f.Registered.Status == "" && f.NodeName == "" {
			// No registration facts at all: a claim still launching.
			if age := now.Sub(f.Created); age > g.Registration {
				return set(StateNotRegistered, f.Created, fmt.Sprintf("no Node %s after launch (grace %s)", Age(age), Age(g.Registration)))
			}
			return set(StateLaunching, f.Created, "waiting for its Node to register")
		}
		since := f.Registered.Since
		if since.IsZero() {
			since = f.Created
		}
		return set(StateNoNode, since, fmt.Sprintf("registered, but its Node %q does not exist", f.NodeName))
	}
	switch f.Initialized.Status {
	case "False", "Unknown":
		since := f.Registered.Since
		if since.IsZero() {
			since = f.Created
		}
		if age := now.Sub(since); age > g.Initialization {
			return set(StateNotInitialized, since, fmt.Sprintf("registered %s ago, Initialized=%s %s (grace %s): not capacity",
				Age(age), f.Initialized.Status, f.Initialized.Reason, Age(g.Initialization)))
		}
		return set(StateInitializing, since, "registered, initializing")
	}
	if f.Drifted {
		return set(StateDrifted, time.Time{}, "drifted: Karpenter replaces it within its disruption budget")
	}
	return set(StateActive, time.Time{}, "")
}

// Count returns how many claims are in each state, per cluster:
// counts[cluster][state].
func Count(claims []Claim) map[string]map[State]int {
	out := map[string]map[State]int{}
	for _, c := range claims {
		m := out[c.Cluster]
		if m == nil {
			m = map[State]int{}
			out[c.Cluster] = m
		}
		m[c.State]++
	}
	return out
}

// Sort orders claims stuck first, then by cluster, state and name.
func Sort(claims []Claim) {
	sort.Slice(claims, func(i, j int) bool {
		a, b := claims[i], claims[j]
		if a.Stuck != b.Stuck {
			return a.Stuck
		}
		if a.Cluster != b.Cluster {
			return a.Cluster < b.Cluster
		}
		if a.State != b.State {
			return a.State < b.State
		}
		return a.Name < b.Name
	})
}

// Age renders a duration as an operator reads it: "45s", "12m", "3h 5m",
// "7d 2h".
func Age(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh %dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd %dh", int(d.Hours())/24, int(d.Hours())%24)
}
