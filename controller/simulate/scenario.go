package simulate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/fleetrepair/fleetrepair/controller/config"
)

// Step kinds (docs/simulator.md).
const (
	KindInject     = "inject"     // hand findings to the controller as if the agent reported them
	KindChange     = "change"     // set attributes on nodes (a rollout, a rollback)
	KindRecover    = "recover"    // a remedy carried out on the nodes (method)
	KindCheckpoint = "checkpoint" // assertions (expect)
	KindResume     = "resume"     // on-call resumes a breaker (cohort), fleetrepair only
)

// Recovery methods of a recover step.
const (
	MethodReboot        = "reboot"         // new boot: current findings become history
	MethodResetGPU      = "reset-gpu"      // modelled as a new boot of the node (see docs)
	MethodDCGMReachable = "dcgm-reachable" // the monitoring plane answers again
	MethodReplace       = "replace"        // the machine is replaced by hand
	MethodClear         = "clear"          // the condition clears by itself (current findings dropped)
)

// Truth is the ground truth of an injected fault, used only to score the
// policies, never by them.
type Truth string

// Truths.
const (
	TruthBroken  Truth = "broken"  // the node's own hardware is faulty: replacing it helps
	TruthShared  Truth = "shared"  // a shared cause (zone, driver, monitoring, rack): replacing helps nothing
	TruthHealthy Truth = "healthy" // nothing is wrong with the node (a monitor's false alarm, an app error)
)

// Scenario is a parsed scenario.yaml: a simulated fleet and a timeline.
type Scenario struct {
	// Name is the scenario's `scenario` field.
	Name string
	// Seed makes random selections (count) and background failures
	// reproducible (default 1).
	Seed       uint64
	Parameters Parameters
	Fleet      FleetSpec
	// T0 is the wall-clock time of offset 0 (clock.t0, default 00:00 on
	// 2026-01-01 UTC); only used to print times.
	T0       time.Time
	Timeline []Step
	// Background lists random lone failures spread over the run.
	Background []Background
	// Expect is the scenario-level breaker outcome: from the scenario's own
	// `breaker` section, or the case's expected.yaml (Load).
	Expect *BreakerExpect
}

// Parameters are the simulation settings (scenario `parameters`).
type Parameters struct {
	// RepairToleration, when > 0, replaces every reason's catalog
	// toleration, for fleetrepair and the baselines alike.
	RepairToleration time.Duration
	// DeletionsPerHour is fleetrepair's cluster budget (default 10, as the
	// clusters table).
	DeletionsPerHour int
	// Tick is the controller's resync period in the simulation (default 30s).
	Tick time.Duration
	// End is when the run stops (default: the last step).
	End time.Duration
	// ReplaceDuration is how long a deleted node takes to be replaced
	// (drain, terminate, launch, driver initialisation; default 10 min).
	// Until then the old machine is still there and still reports.
	ReplaceDuration time.Duration
	// ApprovalTTL is how long fleetrepair's repairs wait for on-call
	// approval before they expire (nobody approves in a simulation;
	// default 24h, repair.Config.ApprovalTTL's).
	ApprovalTTL time.Duration
	// HaltRollouts makes fleetrepair's run skip change steps that would
	// spread a value whose breaker is open (default true).
	HaltRollouts bool
	// NodePoolDeletionsPerHour and MaxInFlightPerNodePool are fleetrepair's
	// per-NodePool budgets (defaults: the controller configuration's, 5 per
	// hour and 1 in flight). A deletion is in flight until its replacement
	// is ready (ReplaceDuration).
	NodePoolDeletionsPerHour int
	MaxInFlightPerNodePool   int
	// Breaker holds breaker.Config overrides; zero fields keep the defaults.
	Breaker BreakerParams
	// given are the parameters the scenario sets: those override the
	// controller configuration the run is given (Scenario.Settings).
	given map[string]bool
}

// BreakerParams are breaker settings a scenario may override.
type BreakerParams struct {
	Window          time.Duration
	CoolDown        time.Duration
	MinFailing      int
	Alpha           float64
	MinRateRatio    float64
	CeilingFraction float64
	CeilingMin      int
	Labels          []string
}

// FleetSpec describes the simulated nodes.
type FleetSpec struct {
	// Cluster is every node's cluster attribute (default "sim").
	Cluster   string
	NodePools []NodePoolSpec
}

// NodePoolSpec is one fleet.nodepools entry.
type NodePoolSpec struct {
	Name string
	// Zones maps zone -> node count. Nodes are numbered across zones in
	// zone-name order: <prefix>1, <prefix>2, ...
	Zones  map[string]int
	Prefix string
	// JoinsAt is when the nodes join the fleet.
	JoinsAt time.Duration
	// Attrs are the cohort attributes every node starts with
	// (instance_type, driver_version, monitoring_image, image, kernel, ...).
	Attrs map[string]string
	// Groups puts consecutive nodes of a zone into groups of the given size
	// under a label key (rack: 16 -> rack=<pool>-<zone>-1, ...).
	Groups map[string]int
}

// Step is one timeline entry. A range (at: 3m-20m) with repeat_every
// repeats it; Times lists every occurrence.
type Step struct {
	Index  int
	Kind   string
	At     time.Duration
	Until  time.Duration // equal to At unless a range
	Repeat time.Duration
	Select Selector
	// Findings are the injected findings, keys as in expected.yaml.
	Findings []map[string]any
	Set      map[string]string
	Method   string
	Expect   map[string]any
	// Truth overrides the inferred ground truth of an inject step.
	Truth Truth
	// Cohort and Actor of a resume step.
	Cohort, Actor string
}

// Times returns the step's occurrences.
func (s Step) Times() []time.Duration {
	if s.Repeat <= 0 {
		return []time.Duration{s.At}
	}
	var out []time.Duration
	for t := s.At; t <= s.Until; t += s.Repeat {
		out = append(out, t)
	}
	return out
}

// Selector picks nodes: by name, and/or by attributes (nodepool, zone or
// any other; a list matches any of its values), then Count of them.
type Selector struct {
	Nodes []string
	Attrs map[string][]string
	Count Count
	// Set is true when the step had a select at all.
	Set bool
}

// Count is how many of the matching nodes a selector picks.
type Count struct {
	All     bool
	N       int
	Percent float64
}

// Background is a stream of random lone failures: on average PerNodePerDay
// failures per selected node per day, each on one node picked at random,
// between From and Until.
type Background struct {
	Name          string
	PerNodePerDay float64
	Select        Selector
	Findings      []map[string]any
	Truth         Truth
	From, Until   time.Duration
}

// BreakerExpect is the scenario-level outcome (expected.yaml `breaker`).
type BreakerExpect struct {
	ExpectTrip bool `json:"expect_trip"`
	// Cohort must be the cohort of every trip when ExpectTrip; empty when
	// there is nothing to correlate.
	Cohort string `json:"cohort"`
	// MaxDeletions bounds fleetrepair's NodeClaim deletions; nil: unbounded.
	MaxDeletions *int `json:"max_deletions"`
}

// rawScenario is the YAML shape. Keys not listed (facts, assumptions,
// templates holding YAML anchors) are documentation and are ignored.
type rawScenario struct {
	Scenario   string            `json:"scenario"`
	Seed       *uint64           `json:"seed"`
	Parameters map[string]any    `json:"parameters"`
	Fleet      json.RawMessage   `json:"fleet"`
	Clock      struct{ T0 any }  `json:"clock"`
	Timeline   []json.RawMessage `json:"timeline"`
	Background []json.RawMessage `json:"background"`
	Breaker    *BreakerExpect    `json:"breaker"`
}

type rawStep struct {
	At          any              `json:"at"`
	Kind        string           `json:"kind"`
	RepeatEvery any              `json:"repeat_every"`
	Select      map[string]any   `json:"select"`
	Findings    []map[string]any `json:"findings"`
	Set         map[string]any   `json:"set"`
	Method      string           `json:"method"`
	Expect      map[string]any   `json:"expect"`
	Truth       Truth            `json:"truth"`
	Cohort      string           `json:"cohort"`
	Actor       string           `json:"actor"`
	Note        string           `json:"note"`
}

type rawBackground struct {
	Name          string           `json:"name"`
	PerNodePerDay float64          `json:"per_node_per_day"`
	Select        map[string]any   `json:"select"`
	Findings      []map[string]any `json:"findings"`
	Truth         Truth            `json:"truth"`
	From          any              `json:"from"`
	Until         any              `json:"until"`
}

// Parse decodes and validates a scenario.yaml. YAML anchors and aliases
// are resolved. Errors name the offending step.
func Parse(data []byte) (*Scenario, error) {
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("decode scenario: %w", err)
	}
	var raw rawScenario
	if err := json.Unmarshal(j, &raw); err != nil {
		return nil, fmt.Errorf("decode scenario: %w", err)
	}
	sc := &Scenario{Name: raw.Scenario, Seed: 1, Expect: raw.Breaker,
		T0: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	if raw.Seed != nil {
		sc.Seed = *raw.Seed
	}
	if sc.Name == "" {
		return nil, errors.New("decode scenario: `scenario` (the name) is required")
	}
	if err := parseParameters(raw.Parameters, &sc.Parameters); err != nil {
		return nil, fmt.Errorf("decode scenario %s: %w", sc.Name, err)
	}
	if raw.Clock.T0 != nil {
		t, err := time.Parse("15:04", fmt.Sprint(raw.Clock.T0))
		if err != nil {
			return nil, fmt.Errorf("decode scenario %s: clock.t0 %v: want HH:MM", sc.Name, raw.Clock.T0)
		}
		sc.T0 = sc.T0.Add(time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute)
	}
	if sc.Fleet, err = parseFleet(raw.Fleet); err != nil {
		return nil, fmt.Errorf("decode scenario %s: %w", sc.Name, err)
	}
	for i, rs := range raw.Timeline {
		st, err := parseStep(i, rs)
		if err != nil {
			return nil, fmt.Errorf("decode scenario %s: timeline[%d]: %w", sc.Name, i, err)
		}
		sc.Timeline = append(sc.Timeline, st)
	}
	for i, rb := range raw.Background {
		b, err := parseBackground(rb)
		if err != nil {
			return nil, fmt.Errorf("decode scenario %s: background[%d]: %w", sc.Name, i, err)
		}
		sc.Background = append(sc.Background, b)
	}
	if len(sc.Timeline) == 0 && len(sc.Background) == 0 {
		return nil, fmt.Errorf("decode scenario %s: the timeline is empty", sc.Name)
	}
	if err := checkLimits(sc); err != nil {
		return nil, fmt.Errorf("decode scenario %s: %w", sc.Name, err)
	}
	return sc, nil
}

// Limits keep a simulation within what one run on a small machine can do;
// a scenario beyond them is refused before it starts (it would exhaust
// memory or never end).
const (
	MaxNodes   = 200_000             // nodes in the fleet
	MinTick    = time.Second         // parameters.tick
	MinRepeat  = time.Second         // repeat_every
	MaxHorizon = 90 * 24 * time.Hour // the last step's offset, and parameters.end
	MaxTicks   = 2_000_000           // horizon / tick
)

func checkLimits(sc *Scenario) error {
	nodes := 0
	for _, p := range sc.Fleet.NodePools {
		for _, n := range p.Zones {
			nodes += n
		}
	}
	if nodes > MaxNodes {
		return fmt.Errorf("fleet: %d nodes, more than the simulator's limit of %d", nodes, MaxNodes)
	}
	if sc.Parameters.Tick < MinTick {
		return fmt.Errorf("parameters.tick: %s is below the limit of %s", sc.Parameters.Tick, MinTick)
	}
	horizon := time.Duration(0)
	for i, st := range sc.Timeline {
		if st.At < 0 {
			return fmt.Errorf("timeline[%d]: at %s is before t0", i, st.At)
		}
		if st.Repeat > 0 && st.Repeat < MinRepeat {
			return fmt.Errorf("timeline[%d]: repeat_every %s is below the limit of %s", i, st.Repeat, MinRepeat)
		}
		horizon = max(horizon, st.Until)
	}
	horizon = max(horizon, sc.Parameters.End)
	if horizon > MaxHorizon {
		return fmt.Errorf("timeline: runs to %s, beyond the limit of %s", horizon, MaxHorizon)
	}
	if horizon/sc.Parameters.Tick > MaxTicks {
		return fmt.Errorf("timeline: %s at a tick of %s is more than %d evaluations", horizon, sc.Parameters.Tick, MaxTicks)
	}
	return nil
}

// ParseExpected reads the `breaker` section of a case's expected.yaml; nil
// when the case has none.
func ParseExpected(data []byte) (*BreakerExpect, error) {
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("decode expected.yaml: %w", err)
	}
	var e struct {
		Breaker *BreakerExpect `json:"breaker"`
	}
	if err := json.Unmarshal(j, &e); err != nil {
		return nil, fmt.Errorf("decode expected.yaml: %w", err)
	}
	return e.Breaker, nil
}

// LoadFile reads a scenario file and, when an expected.yaml lies next to it
// and the scenario has no breaker section of its own, the case's expected
// breaker outcome.
func LoadFile(name string) (*Scenario, error) {
	return load(os.ReadFile, name, filepath.Join(filepath.Dir(name), "expected.yaml"))
}

// LoadFS is LoadFile on a file system (the embedded fixtures.Cases).
func LoadFS(fsys fs.FS, name string) (*Scenario, error) {
	read := func(n string) ([]byte, error) { return fs.ReadFile(fsys, n) }
	return load(read, name, path.Join(path.Dir(name), "expected.yaml"))
}

func load(read func(string) ([]byte, error), name, expected string) (*Scenario, error) {
	data, err := read(name)
	if err != nil {
		return nil, fmt.Errorf("read scenario: %w", err)
	}
	sc, err := Parse(data)
	if err != nil {
		return nil, err
	}
	if sc.Expect != nil {
		return sc, nil
	}
	ed, err := read(expected)
	if errors.Is(err, fs.ErrNotExist) {
		return sc, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read expected outcome: %w", err)
	}
	if sc.Expect, err = ParseExpected(ed); err != nil {
		return nil, err
	}
	return sc, nil
}

func parseParameters(m map[string]any, p *Parameters) error {
	p.DeletionsPerHour, p.Tick, p.HaltRollouts, p.ReplaceDuration = 10, 30*time.Second, true, 10*time.Minute
	p.ApprovalTTL = 24 * time.Hour
	var err error
	p.given = map[string]bool{}
	for k, v := range m {
		p.given[k] = true
		switch k {
		case "nodepool_deletions_per_hour":
			p.NodePoolDeletionsPerHour, err = intOf(v)
		case "max_in_flight_per_nodepool":
			p.MaxInFlightPerNodePool, err = intOf(v)
		case "repair_toleration":
			p.RepairToleration, err = parseOffset(v)
		case "deletions_per_hour":
			p.DeletionsPerHour, err = intOf(v)
		case "tick":
			p.Tick, err = parseOffset(v)
		case "end":
			p.End, err = parseOffset(v)
		case "approval_ttl":
			p.ApprovalTTL, err = parseOffset(v)
		case "replace_duration":
			p.ReplaceDuration, err = parseOffset(v)
		case "halt_rollouts":
			b, ok := v.(bool)
			if !ok {
				err = fmt.Errorf("want true or false, got %v", v)
			}
			p.HaltRollouts = b
		case "breaker":
			err = parseBreakerParams(v, &p.Breaker)
		default:
			return fmt.Errorf("parameters.%s: unknown parameter", k)
		}
		if err != nil {
			return fmt.Errorf("parameters.%s: %w", k, err)
		}
	}
	if p.Tick <= 0 {
		return errors.New("parameters.tick: must be positive")
	}
	if p.DeletionsPerHour < 0 || p.NodePoolDeletionsPerHour < 0 || p.MaxInFlightPerNodePool < 0 {
		return errors.New("parameters: deletions_per_hour, nodepool_deletions_per_hour and max_in_flight_per_nodepool must be >= 0")
	}
	if p.ApprovalTTL <= 0 {
		return errors.New("parameters.approval_ttl: must be positive")
	}
	return nil
}

func parseBreakerParams(v any, b *BreakerParams) error {
	m, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("want a map, got %v", v)
	}
	var err error
	for k, x := range m {
		switch k {
		case "window":
			b.Window, err = parseOffset(x)
		case "cool_down":
			b.CoolDown, err = parseOffset(x)
		case "min_failing":
			b.MinFailing, err = intOf(x)
		case "alpha":
			b.Alpha, err = floatOf(x)
		case "min_rate_ratio":
			b.MinRateRatio, err = floatOf(x)
		case "ceiling_fraction":
			b.CeilingFraction, err = floatOf(x)
		case "ceiling_min_failing":
			b.CeilingMin, err = intOf(x)
		case "labels":
			l, ok := x.([]any)
			if !ok {
				return fmt.Errorf("labels: want a list, got %v", x)
			}
			for _, s := range l {
				b.Labels = append(b.Labels, fmt.Sprint(s))
			}
		default:
			return fmt.Errorf("%s: unknown breaker parameter", k)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
	}
	return nil
}

// poolKeys are the nodepool entry keys that are not node attributes.
var poolKeys = map[string]bool{"name": true, "zones": true, "node_name_prefix": true, "joins_at": true,
	"gpus_per_node": true, "groups": true}

func parseFleet(j json.RawMessage) (FleetSpec, error) {
	var raw struct {
		Cluster   string           `json:"cluster"`
		NodePools []map[string]any `json:"nodepools"`
	}
	if len(j) == 0 {
		return FleetSpec{}, errors.New("fleet: required")
	}
	if err := json.Unmarshal(j, &raw); err != nil {
		return FleetSpec{}, fmt.Errorf("fleet: %w", err)
	}
	f := FleetSpec{Cluster: raw.Cluster}
	if f.Cluster == "" {
		f.Cluster = "sim"
	}
	if len(raw.NodePools) == 0 {
		return f, errors.New("fleet.nodepools: at least one nodepool is required")
	}
	seen := map[string]bool{}
	for i, m := range raw.NodePools {
		p := NodePoolSpec{Zones: map[string]int{}, Attrs: map[string]string{}, Groups: map[string]int{}}
		p.Name, _ = scalar(m["name"])
		if p.Name == "" || seen[p.Name] {
			return f, fmt.Errorf("fleet.nodepools[%d]: a unique name is required", i)
		}
		seen[p.Name] = true
		// scalar: YAML 1.1 reads a bare n or y as a boolean.
		p.Prefix, _ = scalar(m["node_name_prefix"])
		if p.Prefix == "" {
			p.Prefix = p.Name + "-"
		}
		zones, ok := m["zones"].(map[string]any)
		if !ok || len(zones) == 0 {
			return f, fmt.Errorf("fleet.nodepools[%d] (%s): zones {zone: count} is required", i, p.Name)
		}
		for z, v := range zones {
			n, err := intOf(v)
			if err != nil || n < 0 {
				return f, fmt.Errorf("fleet.nodepools[%d] (%s): zones.%s: want a node count, got %v", i, p.Name, z, v)
			}
			p.Zones[z] = n
		}
		if v, ok := m["joins_at"]; ok {
			d, err := parseOffset(v)
			if err != nil {
				return f, fmt.Errorf("fleet.nodepools[%d] (%s): joins_at: %w", i, p.Name, err)
			}
			p.JoinsAt = d
		}
		if g, ok := m["groups"]; ok {
			gm, ok := g.(map[string]any)
			if !ok {
				return f, fmt.Errorf("fleet.nodepools[%d] (%s): groups: want {label: size}", i, p.Name)
			}
			for k, v := range gm {
				n, err := intOf(v)
				if err != nil || n < 1 {
					return f, fmt.Errorf("fleet.nodepools[%d] (%s): groups.%s: want a size >= 1, got %v", i, p.Name, k, v)
				}
				p.Groups[k] = n
			}
		}
		for k, v := range m {
			if poolKeys[k] {
				continue
			}
			s, err := scalar(v)
			if err != nil {
				return f, fmt.Errorf("fleet.nodepools[%d] (%s): %s: %w", i, p.Name, k, err)
			}
			p.Attrs[k] = s
		}
		f.NodePools = append(f.NodePools, p)
	}
	return f, nil
}

func parseStep(i int, j json.RawMessage) (Step, error) {
	var rs rawStep
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rs); err != nil {
		return Step{}, err
	}
	st := Step{Index: i, Kind: rs.Kind, Findings: rs.Findings, Method: rs.Method, Expect: rs.Expect,
		Truth: rs.Truth, Cohort: rs.Cohort, Actor: rs.Actor}
	if rs.At == nil {
		return st, errors.New("at: required")
	}
	at := fmt.Sprint(rs.At)
	var err error
	if lo, hi, ok := strings.Cut(at, "-"); ok {
		if st.At, err = parseOffset(lo); err != nil {
			return st, fmt.Errorf("at: %w", err)
		}
		if st.Until, err = parseOffset(hi); err != nil {
			return st, fmt.Errorf("at: %w", err)
		}
		if st.Until < st.At {
			return st, fmt.Errorf("at: range %s ends before it starts", at)
		}
		if rs.RepeatEvery == nil {
			return st, fmt.Errorf("at: range %s needs repeat_every", at)
		}
	} else {
		if st.At, err = parseOffset(rs.At); err != nil {
			return st, fmt.Errorf("at: %w", err)
		}
		st.Until = st.At
	}
	if rs.RepeatEvery != nil {
		if st.Repeat, err = parseOffset(rs.RepeatEvery); err != nil || st.Repeat <= 0 {
			return st, fmt.Errorf("repeat_every: want a positive duration, got %v", rs.RepeatEvery)
		}
	}
	if rs.Select != nil {
		if st.Select, err = parseSelector(rs.Select); err != nil {
			return st, fmt.Errorf("select: %w", err)
		}
	}
	switch rs.Kind {
	case KindInject:
		if len(rs.Findings) == 0 {
			return st, errors.New("inject: findings are required")
		}
		for k, f := range rs.Findings {
			if d, _ := f["detector"].(string); d == "" {
				return st, fmt.Errorf("findings[%d]: detector is required", k)
			}
		}
	case KindChange:
		if len(rs.Set) == 0 {
			return st, errors.New("change: set is required")
		}
		st.Set = map[string]string{}
		for k, v := range rs.Set {
			if st.Set[k], err = scalar(v); err != nil {
				return st, fmt.Errorf("set.%s: %w", k, err)
			}
		}
	case KindRecover:
		switch rs.Method {
		case MethodReboot, MethodResetGPU, MethodDCGMReachable, MethodReplace, MethodClear:
		default:
			return st, fmt.Errorf("recover: method %q is not one of reboot, reset-gpu, dcgm-reachable, replace, clear", rs.Method)
		}
	case KindCheckpoint:
		if len(rs.Expect) == 0 {
			return st, errors.New("checkpoint: expect is required")
		}
	case KindResume:
		if rs.Cohort == "" {
			return st, errors.New("resume: cohort is required")
		}
		if st.Actor == "" {
			st.Actor = "oncall"
		}
	default:
		return st, fmt.Errorf("kind %q is not one of inject, change, recover, checkpoint, resume", rs.Kind)
	}
	if (rs.Kind == KindInject || rs.Kind == KindChange || rs.Kind == KindRecover) && !st.Select.Set {
		return st, fmt.Errorf("%s: select is required", rs.Kind)
	}
	switch st.Truth {
	case "", TruthBroken, TruthShared, TruthHealthy:
	default:
		return st, fmt.Errorf("truth %q is not one of broken, shared, healthy", st.Truth)
	}
	return st, nil
}

func parseBackground(j json.RawMessage) (Background, error) {
	var rb rawBackground
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rb); err != nil {
		return Background{}, err
	}
	b := Background{Name: rb.Name, PerNodePerDay: rb.PerNodePerDay, Findings: rb.Findings, Truth: rb.Truth}
	if b.Truth == "" {
		b.Truth = TruthBroken
	}
	if b.PerNodePerDay <= 0 || len(b.Findings) == 0 {
		return b, errors.New("per_node_per_day > 0 and findings are required")
	}
	if b.PerNodePerDay > 1 {
		return b, fmt.Errorf("per_node_per_day %g: a background failure rate above 1 per node per day is a wave, not background (limit 1)", b.PerNodePerDay)
	}
	var err error
	if rb.Select != nil {
		if b.Select, err = parseSelector(rb.Select); err != nil {
			return b, fmt.Errorf("select: %w", err)
		}
	}
	if rb.From != nil {
		if b.From, err = parseOffset(rb.From); err != nil {
			return b, fmt.Errorf("from: %w", err)
		}
	}
	b.Until = -1
	if rb.Until != nil {
		if b.Until, err = parseOffset(rb.Until); err != nil {
			return b, fmt.Errorf("until: %w", err)
		}
	}
	return b, nil
}

func parseSelector(m map[string]any) (Selector, error) {
	s := Selector{Attrs: map[string][]string{}, Count: Count{All: true}, Set: true}
	for k, v := range m {
		switch k {
		case "nodes":
			l, ok := v.([]any)
			if !ok {
				return s, fmt.Errorf("nodes: want a list of node names, got %v", v)
			}
			for _, n := range l {
				s.Nodes = append(s.Nodes, fmt.Sprint(n))
			}
		case "count":
			c, err := parseCount(v)
			if err != nil {
				return s, err
			}
			s.Count = c
		default:
			if l, ok := v.([]any); ok {
				for _, x := range l {
					str, err := scalar(x)
					if err != nil {
						return s, fmt.Errorf("%s: %w", k, err)
					}
					s.Attrs[k] = append(s.Attrs[k], str)
				}
				continue
			}
			str, err := scalar(v)
			if err != nil {
				return s, fmt.Errorf("%s: %w", k, err)
			}
			s.Attrs[k] = []string{str}
		}
	}
	return s, nil
}

func parseCount(v any) (Count, error) {
	switch x := v.(type) {
	case float64:
		if x < 0 || x != float64(int(x)) {
			return Count{}, fmt.Errorf("count: want a whole number, all or N%%, got %v", v)
		}
		return Count{N: int(x)}, nil
	case string:
		if x == "all" {
			return Count{All: true}, nil
		}
		if p, ok := strings.CutSuffix(x, "%"); ok {
			f, err := strconv.ParseFloat(p, 64)
			if err != nil || f < 0 || f > 100 {
				return Count{}, fmt.Errorf("count: bad percentage %q", x)
			}
			return Count{Percent: f}, nil
		}
	}
	return Count{}, fmt.Errorf("count: want a whole number, all or N%%, got %v", v)
}

// parseOffset reads an offset from t0: Go durations (90s, 5m, 1h30m) plus
// days (8d, 1d12h). A bare 0 is accepted.
func parseOffset(v any) (time.Duration, error) {
	s := strings.TrimSpace(fmt.Sprint(v))
	if s == "0" {
		return 0, nil
	}
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.Atoi(s[:i])
		if err != nil || n < 0 {
			return 0, fmt.Errorf("offset %q: bad day count", s)
		}
		days, s = time.Duration(n)*24*time.Hour, s[i+1:]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("offset %q: want a duration such as 90s, 5m, 24h or 8d", fmt.Sprint(v))
	}
	return days + d, nil
}

// scalar renders a YAML scalar as the string a node attribute or finding
// attribute holds.
func scalar(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), nil
	case bool:
		return strconv.FormatBool(x), nil
	case nil:
		return "", nil
	}
	return "", fmt.Errorf("want a scalar, got %v", v)
}

func intOf(v any) (int, error) {
	f, ok := v.(float64)
	if !ok || f != float64(int(f)) {
		return 0, fmt.Errorf("want a whole number, got %v", v)
	}
	return int(f), nil
}

func floatOf(v any) (float64, error) {
	f, ok := v.(float64)
	if !ok {
		return 0, fmt.Errorf("want a number, got %v", v)
	}
	return f, nil
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Settings returns the controller configuration fleetrepair's run of the
// scenario uses: c (the configuration the controller runs with; Options.Config)
// with the scenario's own parameters over it — repair_toleration,
// approval_ttl, deletions_per_hour, nodepool_deletions_per_hour,
// max_in_flight_per_nodepool and the breaker settings it names — and the
// label cohorts of both, plus every fleet group label (rack: 16), as
// breaker labels. A scenario that sets nothing runs with c as the
// controller does.
func (sc *Scenario) Settings(c config.Config) config.Config {
	p := sc.Parameters
	c.Breaker.Labels = slices.Clone(c.Breaker.Labels)
	c.Breaker.RolloutKeys = slices.Clone(c.Breaker.RolloutKeys)
	if p.given["repair_toleration"] {
		c.Repair.Toleration = p.RepairToleration
	}
	if p.given["approval_ttl"] {
		c.Repair.ApprovalTTL = p.ApprovalTTL
	}
	if p.given["deletions_per_hour"] {
		c.Budgets.DeletionsPerHour = p.DeletionsPerHour
	}
	if p.given["nodepool_deletions_per_hour"] {
		c.Budgets.NodePoolDeletionsPerHour = p.NodePoolDeletionsPerHour
	}
	if p.given["max_in_flight_per_nodepool"] {
		c.Budgets.MaxInFlightPerNodePool = p.MaxInFlightPerNodePool
	}
	b := p.Breaker
	setD := func(dst *time.Duration, v time.Duration) {
		if v != 0 {
			*dst = v
		}
	}
	setD(&c.Breaker.Window, b.Window)
	setD(&c.Breaker.CoolDown, b.CoolDown)
	if b.MinFailing != 0 {
		c.Breaker.MinFailing = b.MinFailing
	}
	if b.Alpha != 0 {
		c.Breaker.Alpha = b.Alpha
	}
	if b.MinRateRatio != 0 {
		c.Breaker.MinRateRatio = b.MinRateRatio
	}
	if b.CeilingFraction != 0 {
		c.Breaker.CeilingFraction = b.CeilingFraction
	}
	if b.CeilingMin != 0 {
		c.Breaker.CeilingMinFailing = b.CeilingMin
	}
	add := func(l string) {
		if !slices.Contains(c.Breaker.Labels, l) {
			c.Breaker.Labels = append(c.Breaker.Labels, l)
		}
	}
	for _, l := range b.Labels {
		add(l)
	}
	for _, np := range sc.Fleet.NodePools {
		for _, g := range sortedKeys(np.Groups) {
			add(g)
		}
	}
	return c
}
