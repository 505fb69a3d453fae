// Package conformance runs one table of the repair ledger's rules against
// each of the three callers of controller/decide — the live reconciler
// (controller/repair, on a real PostgreSQL and a controller-runtime fake
// client with the simulated Karpenter), the shadow replay
// (controller/shadow, on the same store) and the simulator
// (controller/simulate) — as River's riverdrivertest runs one suite against
// each driver. A rule changes in controller/decide and in this table, in
// one place; a caller that drifts fails here.
//
// Each case is a small fleet, findings injected at offsets from t0, and
// the outcome per node at the end, normalised over what each caller
// reports (see Outcome).
package conformance

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/config"
	"github.com/fleetrepair/fleetrepair/controller/decide"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// t0 is the start of every case: nodes exist from an hour before.
var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// resync is the pass period every caller runs at (the controller's default).
const resync = 10 * time.Second

// Outcome is where a node's repair stands at the end of a case.
type Outcome string

// Outcomes.
const (
	// None: no open repair and nothing deleted.
	None Outcome = "none"
	// Deleted: the node's NodeClaim was deleted.
	Deleted Outcome = "deleted"
	// Tolerating: a repair is open and inside its toleration window.
	Tolerating Outcome = "tolerating"
	// Delayed: the toleration is over and a deletion budget delays it.
	Delayed Outcome = "delayed"
	// HeldByBreaker / HeldByAction: awaiting on-call approval.
	HeldByBreaker Outcome = "held:breaker"
	HeldByAction  Outcome = "held:action"
	// WaitingDoNotDisrupt / WaitingOptOut: the toleration is over and the
	// node's owners hold the deletion (karpenter.sh/do-not-disrupt,
	// fleetrepair.dev/repair=disabled).
	WaitingDoNotDisrupt Outcome = "waiting:" + decide.HoldDoNotDisrupt
	WaitingOptOut       Outcome = "waiting:" + decide.HoldOptOut
)

// Pool is one NodePool: Zones maps zone -> node count; nodes are named
// Prefix1, Prefix2, ... over the zones in name order (the simulator's
// naming).
type Pool struct {
	Name, Prefix string
	Zones        map[string]int
}

// Inject is findings reported by nodes at an offset from t0; each finding
// is written as the case corpus and the simulator write them
// (simulate.FindingFromSpec).
type Inject struct {
	At    time.Duration
	Nodes []string
	// Boot is the nodes' boot number: a higher one than their last
	// injection's means they rebooted just before (the simulator's recover
	// step, method reboot).
	Boot     int
	Findings []map[string]any
}

// bootID is the boot ID of a node's boot number.
func bootID(node string, boot int) string {
	if boot == 0 {
		return "boot-" + node
	}
	return fmt.Sprintf("boot-%s-%d", node, boot)
}

// Case is one rule.
type Case struct {
	Name  string
	Pools []Pool
	// Config is the controller configuration file (docs/config.md) every
	// caller runs with, parsed once by config.Parse ("": the defaults).
	Config string
	// Labels are node labels by node name (a rack): the Node's labels live,
	// the stored node's for the shadow, a change step at 0s in the simulator.
	Labels map[string]map[string]string
	Inject []Inject
	// Owners maps a node to its owners' hold for the whole case
	// (decide.HoldDoNotDisrupt: live, a Pod on it annotated
	// karpenter.sh/do-not-disrupt; decide.HoldOptOut: live, the Node
	// labelled fleetrepair.dev/repair=disabled).
	Owners map[string]string
	End    time.Duration
	// Want is the outcome of each named node; every other node must end
	// None.
	Want map[string]Outcome
}

// Caller runs a case and returns every node's outcome.
type Caller func(t *testing.T, c Case) map[string]Outcome

// nodeSpec is one node of a case's fleet.
type nodeSpec struct {
	name, pool, zone string
	labels           map[string]string
}

func (c Case) nodes() []nodeSpec {
	var out []nodeSpec
	for _, p := range c.Pools {
		zones := make([]string, 0, len(p.Zones))
		for z := range p.Zones {
			zones = append(zones, z)
		}
		sort.Strings(zones)
		n := 0
		for _, z := range zones {
			for range p.Zones[z] {
				n++
				name := fmt.Sprintf("%s%d", p.Prefix, n)
				out = append(out, nodeSpec{name: name, pool: p.Name, zone: z, labels: c.Labels[name]})
			}
		}
	}
	return out
}

func nodeNames(prefix string, from, to int) []string {
	var out []string
	for i := from; i <= to; i++ {
		out = append(out, fmt.Sprintf("%s%d", prefix, i))
	}
	return out
}

var (
	gpuLost = map[string]any{"detector": "xid", "xid": 79.0, "gpu_pci": "0000:4e:00.0"}
	gpuHang = map[string]any{"detector": "xid", "xid": 109.0, "gpu_pci": "0000:4e:00.0"} // reset-gpu
	appXid  = map[string]any{"detector": "xid", "xid": 13.0, "gpu_pci": "0000:4e:00.0"}  // app-error, event
	infoXid = map[string]any{"detector": "xid", "xid": 92.0, "gpu_pci": "0000:4e:00.0"}  // fault class none, event
	unreg   = map[string]any{"detector": "nodeclaim-status", "registered": "False"}      // provisioning, severity none
	// driver is the driver banner a node logs at every boot.
	driver = map[string]any{"detector": "driver-version", "value": "570.133.20"}
)

// zoneFleet: ten nodes in z1 (n1..n10), forty in z2 (n11..n50): six of
// ten failing in one zone is concentrated, one of forty is not.
var zoneFleet = []Pool{{Name: "gpu", Prefix: "n", Zones: map[string]int{"z1": 10, "z2": 40}}}

// Cases is the table of rules every caller must agree on.
var Cases = []Case{
	{
		Name:   "a lost GPU is replaced once its toleration is over",
		Pools:  []Pool{{Name: "gpu", Prefix: "n", Zones: map[string]int{"z1": 4}}},
		Inject: []Inject{{At: time.Minute, Nodes: []string{"n2"}, Findings: []map[string]any{gpuLost}}},
		End:    15 * time.Minute,
		Want:   map[string]Outcome{"n2": Deleted},
	},
	{
		Name:   "nothing is deleted inside the toleration window",
		Pools:  []Pool{{Name: "gpu", Prefix: "n", Zones: map[string]int{"z1": 4}}},
		Inject: []Inject{{At: time.Minute, Nodes: []string{"n2"}, Findings: []map[string]any{gpuLost}}},
		End:    9 * time.Minute,
		Want:   map[string]Outcome{"n2": Tolerating},
	},
	{
		Name:   "a reset-class fault waits for on-call: the action is not executable",
		Pools:  []Pool{{Name: "gpu", Prefix: "n", Zones: map[string]int{"z1": 4}}},
		Inject: []Inject{{At: time.Minute, Nodes: []string{"n3"}, Findings: []map[string]any{gpuHang}}},
		End:    45 * time.Minute,
		Want:   map[string]Outcome{"n3": HeldByAction},
	},
	{
		Name:   "an approval not given in time expires, and the condition opens a new repair",
		Pools:  []Pool{{Name: "gpu", Prefix: "n", Zones: map[string]int{"z1": 4}}},
		Config: "repair: {approvalTTL: 30m}",
		Inject: []Inject{{At: time.Minute, Nodes: []string{"n3"}, Findings: []map[string]any{gpuHang}}},
		// Awaiting approval from 11m, expired at 41m, a new repair tolerating.
		End:  45 * time.Minute,
		Want: map[string]Outcome{"n3": Tolerating},
	},
	{
		Name:  "a fault that returns after its remedy escalates and skips the toleration",
		Pools: []Pool{{Name: "gpu", Prefix: "n", Zones: map[string]int{"z1": 4}}},
		Inject: []Inject{
			{At: time.Minute, Nodes: []string{"n3"}, Findings: []map[string]any{gpuHang}},
			// On-call reset it by hand (a reboot): the condition clears.
			{At: 15 * time.Minute, Nodes: []string{"n3"}, Boot: 1, Findings: []map[string]any{driver}},
			// The hang returns on the same GPU: replace, at once.
			{At: 20 * time.Minute, Nodes: []string{"n3"}, Boot: 1, Findings: []map[string]any{gpuHang}},
		},
		End:  21 * time.Minute,
		Want: map[string]Outcome{"n3": Deleted},
	},
	{
		Name:  "a condition that clears resolves its repair",
		Pools: []Pool{{Name: "gpu", Prefix: "n", Zones: map[string]int{"z1": 4}}},
		Inject: []Inject{
			{At: time.Minute, Nodes: []string{"n3"}, Findings: []map[string]any{gpuHang}},
			{At: 15 * time.Minute, Nodes: []string{"n3"}, Boot: 1, Findings: []map[string]any{driver}},
		},
		End:  21 * time.Minute,
		Want: map[string]Outcome{},
	},
	{
		Name:   "an application error opens no repair",
		Pools:  []Pool{{Name: "gpu", Prefix: "n", Zones: map[string]int{"z1": 4}}},
		Inject: []Inject{{At: time.Minute, Nodes: []string{"n1"}, Findings: []map[string]any{appXid}}},
		End:    15 * time.Minute,
		Want:   map[string]Outcome{},
	},
	{
		Name:   "a zone breaker holds its cohort; a lone failure elsewhere is replaced",
		Pools:  zoneFleet,
		Inject: []Inject{{At: time.Minute, Nodes: append(nodeNames("n", 1, 6), "n20"), Findings: []map[string]any{gpuLost}}},
		End:    20 * time.Minute,
		Want: map[string]Outcome{"n1": HeldByBreaker, "n2": HeldByBreaker, "n3": HeldByBreaker, "n4": HeldByBreaker,
			"n5": HeldByBreaker, "n6": HeldByBreaker, "n20": Deleted},
	},
	{
		// n20's deletion takes the NodePool's one in-flight slot at 11m
		// and holds it for 5 minutes (docs/shadow.md "In flight"); the
		// breaker is decided before the budgets, so the held cohort is in
		// the approval queue at once, not delayed until the slot frees.
		Name:   "a breaker-held cohort goes to on-call while its NodePool's budget is spent",
		Pools:  zoneFleet,
		Config: "budgets: {maxInFlightPerNodePool: 1}",
		Inject: []Inject{{At: time.Minute, Nodes: append(nodeNames("n", 1, 6), "n20"), Findings: []map[string]any{gpuLost}}},
		End:    12 * time.Minute,
		Want: map[string]Outcome{"n1": HeldByBreaker, "n2": HeldByBreaker, "n3": HeldByBreaker, "n4": HeldByBreaker,
			"n5": HeldByBreaker, "n6": HeldByBreaker, "n20": Deleted},
	},
	{
		Name:  "events of a real fault class are breaker signals",
		Pools: zoneFleet,
		Inject: []Inject{
			{At: time.Minute, Nodes: nodeNames("n", 1, 6), Findings: []map[string]any{appXid}},
			{At: 2 * time.Minute, Nodes: []string{"n7"}, Findings: []map[string]any{gpuLost}},
		},
		End:  15 * time.Minute,
		Want: map[string]Outcome{"n7": HeldByBreaker},
	},
	{
		Name:  "fault class none is no breaker signal",
		Pools: zoneFleet,
		Inject: []Inject{
			{At: time.Minute, Nodes: nodeNames("n", 1, 6), Findings: []map[string]any{infoXid}},
			{At: 2 * time.Minute, Nodes: []string{"n7"}, Findings: []map[string]any{gpuLost}},
		},
		End:  15 * time.Minute,
		Want: map[string]Outcome{"n7": Deleted},
	},
	{
		Name:  "fault class provisioning is no breaker signal",
		Pools: zoneFleet,
		Inject: []Inject{
			{At: time.Minute, Nodes: nodeNames("n", 1, 6), Findings: []map[string]any{unreg}},
			{At: 2 * time.Minute, Nodes: []string{"n7"}, Findings: []map[string]any{gpuLost}},
		},
		End:  15 * time.Minute,
		Want: map[string]Outcome{"n7": Deleted},
	},
	{
		Name:   "do-not-disrupt holds the deletion, however long; a node without it is replaced",
		Pools:  []Pool{{Name: "gpu", Prefix: "n", Zones: map[string]int{"z1": 4}}},
		Owners: map[string]string{"n2": decide.HoldDoNotDisrupt},
		Inject: []Inject{{At: time.Minute, Nodes: []string{"n2", "n3"}, Findings: []map[string]any{gpuLost}}},
		End:    45 * time.Minute,
		Want:   map[string]Outcome{"n2": WaitingDoNotDisrupt, "n3": Deleted},
	},
	{
		Name:   "an opted-out node is never replaced",
		Pools:  []Pool{{Name: "gpu", Prefix: "n", Zones: map[string]int{"z1": 4}}},
		Owners: map[string]string{"n1": decide.HoldOptOut},
		Inject: []Inject{{At: time.Minute, Nodes: []string{"n1"}, Findings: []map[string]any{gpuLost}}},
		End:    45 * time.Minute,
		Want:   map[string]Outcome{"n1": WaitingOptOut},
	},
	{
		Name:   "the owners' hold comes before the breaker: on-call is not asked for what the owner holds",
		Pools:  zoneFleet,
		Owners: map[string]string{"n1": decide.HoldDoNotDisrupt},
		Inject: []Inject{{At: time.Minute, Nodes: append(nodeNames("n", 1, 6), "n20"), Findings: []map[string]any{gpuLost}}},
		End:    20 * time.Minute,
		Want: map[string]Outcome{"n1": WaitingDoNotDisrupt, "n2": HeldByBreaker, "n3": HeldByBreaker, "n4": HeldByBreaker,
			"n5": HeldByBreaker, "n6": HeldByBreaker, "n20": Deleted},
	},
	{
		Name: "the deletions-per-hour budget delays the next deletion",
		Pools: []Pool{
			{Name: "a", Prefix: "a", Zones: map[string]int{"z1": 3}},
			{Name: "b", Prefix: "b", Zones: map[string]int{"z2": 3}},
		},
		Config: "budgets: {deletionsPerHour: 1}",
		Inject: []Inject{
			{At: time.Minute, Nodes: []string{"a1"}, Findings: []map[string]any{gpuLost}},
			{At: 3 * time.Minute, Nodes: []string{"b2"}, Findings: []map[string]any{gpuLost}},
		},
		End:  30 * time.Minute,
		Want: map[string]Outcome{"a1": Deleted, "b2": Delayed},
	},
	{
		Name:   "the per-NodePool hourly budget delays the pool's next deletion, not another pool's",
		Pools:  twoPools,
		Config: "budgets: {nodePoolDeletionsPerHour: 1}",
		Inject: []Inject{
			{At: time.Minute, Nodes: []string{"a1"}, Findings: []map[string]any{gpuLost}},
			{At: 2 * time.Minute, Nodes: []string{"a2", "b1"}, Findings: []map[string]any{gpuLost}},
		},
		End:  30 * time.Minute,
		Want: map[string]Outcome{"a1": Deleted, "a2": Delayed, "b1": Deleted},
	},
	{
		// a1's deletion is in flight from 11m until its NodeClaim is gone
		// (5 minutes: config.DefaultDeletingFor, the replays' assumption
		// and the simulated Karpenter's delay here).
		Name:   "one deletion in flight per NodePool delays the next until the first is done",
		Pools:  twoPools,
		Config: "budgets: {maxInFlightPerNodePool: 1}",
		Inject: []Inject{
			{At: time.Minute, Nodes: []string{"a1"}, Findings: []map[string]any{gpuLost}},
			{At: 2 * time.Minute, Nodes: []string{"a2"}, Findings: []map[string]any{gpuLost}},
		},
		End:  14 * time.Minute,
		Want: map[string]Outcome{"a1": Deleted, "a2": Delayed},
	},
	{
		Name:   "two deletions in flight per NodePool let both go",
		Pools:  twoPools,
		Config: "budgets: {maxInFlightPerNodePool: 2}",
		Inject: []Inject{
			{At: time.Minute, Nodes: []string{"a1"}, Findings: []map[string]any{gpuLost}},
			{At: 2 * time.Minute, Nodes: []string{"a2"}, Findings: []map[string]any{gpuLost}},
		},
		End:  14 * time.Minute,
		Want: map[string]Outcome{"a1": Deleted, "a2": Deleted},
	},
	{
		Name:   "a NodePool below its minimum healthy count deletes nothing",
		Pools:  twoPools,
		Config: "budgets: {minHealthy: 3}",
		Inject: []Inject{{At: time.Minute, Nodes: []string{"a1"}, Findings: []map[string]any{gpuLost}},
			{At: time.Minute, Nodes: []string{"b1"}, Findings: []map[string]any{gpuLost}}},
		End:  20 * time.Minute,
		Want: map[string]Outcome{"a1": Delayed, "b1": Delayed},
	},
	{
		// The rack label reaches the breakers only through the
		// configuration file: six of a rack's eight nodes failing is a
		// rack cohort, and nothing else (one NodePool, one zone) tells the
		// racks apart.
		Name:   "a rack configured as a label cohort trips its breaker",
		Pools:  rackPool,
		Labels: racks,
		Config: "breaker: {labels: [topology.kubernetes.io/rack]}\nbudgets: {maxInFlightPerNodePool: 10, nodePoolDeletionsPerHour: 10}",
		Inject: []Inject{{At: time.Minute, Nodes: nodeNames("n", 1, 6), Findings: []map[string]any{gpuLost}}},
		End:    15 * time.Minute,
		Want: map[string]Outcome{"n1": HeldByBreaker, "n2": HeldByBreaker, "n3": HeldByBreaker, "n4": HeldByBreaker,
			"n5": HeldByBreaker, "n6": HeldByBreaker},
	},
	{
		Name:   "a rack not configured as a cohort holds nothing",
		Pools:  rackPool,
		Labels: racks,
		Config: "budgets: {maxInFlightPerNodePool: 10, nodePoolDeletionsPerHour: 10}",
		Inject: []Inject{{At: time.Minute, Nodes: nodeNames("n", 1, 6), Findings: []map[string]any{gpuLost}}},
		End:    15 * time.Minute,
		Want:   map[string]Outcome{"n1": Deleted, "n2": Deleted, "n3": Deleted, "n4": Deleted, "n5": Deleted, "n6": Deleted},
	},
}

// twoPools: NodePools a (a1..a3) and b (b1..b3).
var twoPools = []Pool{
	{Name: "a", Prefix: "a", Zones: map[string]int{"z1": 3}},
	{Name: "b", Prefix: "b", Zones: map[string]int{"z2": 3}},
}

// rackPool and racks: one NodePool in one zone, six racks of eight nodes
// (n1..n8 in rack r1, n9..n16 in r2, ...), told apart by their
// topology.kubernetes.io/rack label only.
var (
	rackPool = []Pool{{Name: "gpu", Prefix: "n", Zones: map[string]int{"z1": 48}}}
	racks    = func() map[string]map[string]string {
		out := map[string]map[string]string{}
		for i := range 48 {
			out[fmt.Sprintf("n%d", i+1)] = map[string]string{"topology.kubernetes.io/rack": fmt.Sprintf("r%d", i/8+1)}
		}
		return out
	}()
)

// conform runs every case against one caller.
func conform(t *testing.T, call Caller) {
	for _, c := range Cases {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			got := call(t, c)
			for _, n := range c.nodes() {
				want, ok := c.Want[n.name]
				if !ok {
					want = None
				}
				if g, ok := got[n.name]; !ok && want != None || ok && g != want {
					t.Errorf("%s: %s, want %s", n.name, orNone(g), want)
				}
			}
		})
	}
}

// settings is the case's controller configuration, parsed as the
// controller parses its file.
func (c Case) settings(t *testing.T) config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(c.Config), nil)
	if err != nil {
		t.Fatalf("case config %q: %v", c.Config, err)
	}
	if cfg.Repair.Resync != resync {
		t.Fatalf("case config: resync %s, the callers step %s", cfg.Repair.Resync, resync)
	}
	return cfg
}

func orNone(o Outcome) Outcome {
	if o == "" {
		return None
	}
	return o
}
