package breaker

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// pool describes nodes to generate: count nodes per zone, named
// <prefix><n>, with attrs; rackSize > 0 puts consecutive nodes into racks.
type pool struct {
	name     string
	prefix   string
	zones    map[string]int
	attrs    map[string]string
	rackSize int
}

func gen(pools ...pool) []Node {
	var out []Node
	for _, p := range pools {
		n := 0
		zones := make([]string, 0, len(p.zones))
		for z := range p.zones {
			zones = append(zones, z)
		}
		slices.Sort(zones)
		for _, z := range zones {
			for range p.zones[z] {
				n++
				a := map[string]string{KeyCluster: "c1", KeyNodePool: p.name, KeyZone: z}
				for k, v := range p.attrs {
					a[k] = v
				}
				if p.rackSize > 0 {
					a["rack"] = fmt.Sprintf("%s-r%d", p.name, (n-1)/p.rackSize+1)
				}
				out = append(out, Node{Name: fmt.Sprintf("%s%d", p.prefix, n), Attrs: a})
			}
		}
	}
	return out
}

func names(prefix string, from, to int) []string {
	var out []string
	for i := from; i <= to; i++ {
		out = append(out, fmt.Sprintf("%s%d", prefix, i))
	}
	return out
}

// step is one evaluation of a breaker test timeline: at offset at, signals
// for fail are added, then optional human actions, then Evaluate.
type step struct {
	at      time.Duration
	fail    []string
	ongoing []string // nodes still failing (active condition)
	resume  string
	kill    *bool
	// checks after Evaluate
	wantOpen    []string // exactly these cohort breakers open (nil: not checked)
	wantCeiling *bool
	allow       map[string]bool
}

func ptr[T any](v T) *T { return &v }

func TestEvaluate(t *testing.T) {
	t.Parallel()
	type tc struct {
		name      string
		cfg       Config
		nodes     []Node
		steps     []step
		wantTrips []string // cohorts tripped, in order, over the whole run
		explains  map[string][]string
	}
	bigZones := gen(
		pool{name: "train", prefix: "t", zones: map[string]int{"zone-a": 600, "zone-b": 600, "zone-c": 600}, attrs: map[string]string{KeyDriverVersion: "580", KeyInstanceType: "p5"}},
		pool{name: "infer", prefix: "i", zones: map[string]int{"zone-a": 400, "zone-b": 400, "zone-c": 400}, attrs: map[string]string{KeyDriverVersion: "580", KeyInstanceType: "g6"}},
	)
	// train zone-b is t601..t1200, infer zone-b is i401..i800.
	zoneB := append(names("t", 601, 760), names("i", 401, 480)...)
	render := gen(
		pool{name: "render", prefix: "node-b", zones: map[string]int{"zone-a": 235, "zone-b": 235, "zone-c": 234}, attrs: map[string]string{KeyDriverVersion: "580.159.03"}},
		pool{name: "render-canary", prefix: "node-r", zones: map[string]int{"zone-a": 16, "zone-b": 16, "zone-c": 16}, attrs: map[string]string{KeyDriverVersion: "610.57.04"}},
	)
	monitoring := gen(
		pool{name: "infer-g4dn", prefix: "node-g", zones: map[string]int{"zone-a": 20, "zone-b": 20, "zone-c": 20}, attrs: map[string]string{KeyMonitoringImage: "dcgm:prev", KeyDriverVersion: "drv"}},
		pool{name: "train-p4d", prefix: "node-p", zones: map[string]int{"zone-a": 16, "zone-b": 16}, attrs: map[string]string{KeyMonitoringImage: "dcgm:prev", KeyDriverVersion: "drv"}},
		pool{name: "train-p5", prefix: "node-q", zones: map[string]int{"zone-a": 8, "zone-b": 8, "zone-c": 8}, attrs: map[string]string{KeyMonitoringImage: "dcgm:prev", KeyDriverVersion: "drv"}},
	)
	wave := []string{"node-g1", "node-g9", "node-g21", "node-g30", "node-g41", "node-g55", "node-p2", "node-p11", "node-p20", "node-q1", "node-q9", "node-q17"}
	for _, n := range monitoring {
		if slices.Contains(wave, n.Name) {
			n.Attrs[KeyMonitoringImage] = "dcgm:next"
		}
	}
	racks := gen(pool{name: "train", prefix: "n", zones: map[string]int{"zone-a": 512, "zone-b": 512}, rackSize: 16, attrs: map[string]string{KeyDriverVersion: "580"}})
	small := gen(
		pool{name: "large", prefix: "node-a", zones: map[string]int{"zone-a": 3}},
		pool{name: "general", prefix: "g", zones: map[string]int{"zone-a": 100, "zone-b": 100}},
	)
	onlyCluster := gen(pool{name: "p", prefix: "n", zones: map[string]int{"z": 100}})
	for _, n := range onlyCluster {
		delete(n.Attrs, KeyNodePool)
		delete(n.Attrs, KeyZone)
	}

	tests := []tc{
		{
			name: "AZ outage trips the zone, lone failures elsewhere still repaired", nodes: bigZones,
			steps: []step{
				{at: 0, fail: []string{"t5"}},
				{at: 2 * time.Minute, fail: zoneB[:60]},
				{at: 4 * time.Minute, fail: zoneB[60:], wantOpen: []string{"zone=zone-b"}, wantCeiling: ptr(false),
					allow: map[string]bool{"t5": true, "t601": false, "i401": false, "i1": true}},
			},
			wantTrips: []string{"zone=zone-b"},
		},
		{
			name: "driver rollout names the driver, not the nodepool it coincides with", nodes: render,
			steps: []step{
				{at: 2 * time.Minute, fail: names("node-r", 1, 24), wantOpen: []string{"driver_version=610.57.04"},
					allow: map[string]bool{"node-r30": false, "node-b1": true}},
			},
			wantTrips: []string{"driver_version=610.57.04"},
			explains:  map[string][]string{"driver_version=610.57.04": {"nodepool=render-canary"}},
		},
		{
			name: "monitoring rollout spread over pools names the monitoring image", nodes: monitoring,
			steps: []step{
				{at: time.Minute, fail: wave, wantOpen: []string{"monitoring_image=dcgm:next"}, wantCeiling: ptr(false)},
			},
			wantTrips: []string{"monitoring_image=dcgm:next"},
		},
		{
			name: "rack fate-sharing trips the configured rack label", nodes: racks, cfg: Config{Labels: []string{"rack"}},
			steps: []step{
				{at: 0, fail: names("n", 97, 104)},
				{at: time.Minute, fail: names("n", 105, 112), wantOpen: []string{"rack=train-r7"},
					allow: map[string]bool{"n100": false, "n1": true}},
			},
			wantTrips: []string{"rack=train-r7"},
		},
		{
			name: "lone failure in a 3-node pool does not trip", nodes: small,
			steps: []step{
				{at: 0, fail: []string{"node-a2"}, wantOpen: []string{}, wantCeiling: ptr(false), allow: map[string]bool{"node-a2": true}},
				{at: 10 * time.Minute, wantOpen: []string{}, allow: map[string]bool{"node-a2": true}},
			},
		},
		{
			name: "lone failure in a 3-node fleet does not trip the ceiling", nodes: small[:3],
			steps: []step{
				{at: 0, fail: []string{"node-a2"}, wantOpen: []string{}, wantCeiling: ptr(false), allow: map[string]bool{"node-a2": true}},
			},
		},
		{
			name: "two failures in a 3-node pool stay under the floor", nodes: small,
			steps: []step{
				{at: 0, fail: []string{"node-a1", "node-a2"}, wantOpen: []string{}, allow: map[string]bool{"node-a2": true}},
			},
		},
		{
			name: "cool-down closes after a quiet period, not before", nodes: render,
			steps: []step{
				{at: 0, fail: names("node-r", 1, 10)},
				{at: 3 * time.Minute, fail: names("node-r", 11, 20), wantOpen: []string{"driver_version=610.57.04"}},
				// Sticky: still open long after the window, while failures continue.
				{at: 20 * time.Minute, fail: []string{"node-r3"}, wantOpen: []string{"driver_version=610.57.04"}},
				{at: 34*time.Minute + 59*time.Second, wantOpen: []string{"driver_version=610.57.04"}},
				{at: 35 * time.Minute, wantOpen: []string{}, allow: map[string]bool{"node-r3": true}},
			},
			wantTrips: []string{"driver_version=610.57.04"},
		},
		{
			name: "ongoing failures keep a breaker open past its cool-down but never trip one", nodes: render,
			steps: []step{
				{at: 0, ongoing: names("node-r", 1, 48), wantOpen: []string{}, wantCeiling: ptr(false)},
				{at: time.Minute, fail: names("node-r", 1, 10), wantOpen: []string{"driver_version=610.57.04"}},
				{at: 30 * time.Minute, ongoing: names("node-r", 1, 10), wantOpen: []string{"driver_version=610.57.04"}},
				{at: 45 * time.Minute, ongoing: []string{"node-r2"}, wantOpen: []string{"driver_version=610.57.04"}},
				{at: 59 * time.Minute, wantOpen: []string{"driver_version=610.57.04"}},
				{at: 60 * time.Minute, wantOpen: []string{}}, // 45m + 15m cool-down
			},
			wantTrips: []string{"driver_version=610.57.04"},
		},
		{
			name: "resume closes at once; acknowledged failures do not re-trip, new ones do", nodes: render,
			steps: []step{
				{at: 0, fail: names("node-r", 1, 10), wantOpen: []string{"driver_version=610.57.04"}},
				{at: time.Minute, resume: "driver_version=610.57.04", wantOpen: []string{}, allow: map[string]bool{"node-r1": true}},
				// The acknowledged nodes keep failing (a condition persists): no re-trip.
				{at: 2 * time.Minute, fail: append(names("node-r", 1, 10), "node-r20", "node-r21"), wantOpen: []string{}},
				{at: 3 * time.Minute, fail: append(names("node-r", 1, 10), "node-r22"), wantOpen: []string{"driver_version=610.57.04"}},
			},
			wantTrips: []string{"driver_version=610.57.04", "driver_version=610.57.04"},
		},
		{
			name: "kill switch holds everything until switched off", nodes: small,
			steps: []step{
				{at: 0, kill: ptr(true), allow: map[string]bool{"node-a2": false, "g1": false}},
				{at: time.Minute, kill: ptr(false), allow: map[string]bool{"node-a2": true, "g1": true}},
			},
		},
		{
			name: "fleet ceiling when no cohort can explain the failures", nodes: onlyCluster,
			steps: []step{
				{at: 0, fail: names("n", 1, 9), wantOpen: []string{}, wantCeiling: ptr(false)},
				{at: time.Minute, fail: []string{"n50"}, wantOpen: []string{}, wantCeiling: ptr(true), allow: map[string]bool{"n99": false}},
				{at: 12 * time.Minute, wantCeiling: ptr(true)},                                       // below since 12m (signals left the window)
				{at: 26*time.Minute + 59*time.Second, wantCeiling: ptr(true)},                        // cool-down not over
				{at: 27 * time.Minute, wantCeiling: ptr(false), allow: map[string]bool{"n99": true}}, // 12m + 15m
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := NewPolicy(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			fleet := p.Fleet(tt.nodes)
			byName := map[string]Node{}
			for _, n := range tt.nodes {
				byName[n.Name] = n
			}
			var st State
			var sigs []Signal
			var trips []string
			for _, s := range tt.steps {
				now := t0.Add(s.at)
				for _, n := range s.fail {
					sigs = append(sigs, Signal{Node: n, At: now})
				}
				for _, n := range s.ongoing {
					sigs = append(sigs, Signal{Node: n, At: now, Ongoing: true})
				}
				if s.kill != nil {
					st, _ = SetKillSwitch(st, *s.kill, "oncall@example.invalid", "test", now)
				}
				if s.resume != "" {
					var d Decision
					if st, d, err = Resume(st, s.resume, "oncall@example.invalid", "rolled back", now); err != nil {
						t.Fatalf("at %s: %v", s.at, err)
					}
					if d.Cause != CauseResumed || d.To != Closed {
						t.Errorf("at %s: resume decision %+v", s.at, d)
					}
				}
				var ds []Decision
				st, ds = p.Evaluate(now, fleet, sigs, st)
				for _, d := range ds {
					if d.Cause == CauseTripped {
						trips = append(trips, d.Cohort)
						checkEvidence(t, d, p.Config())
					}
				}
				if s.wantOpen != nil {
					if got := st.OpenCohorts(); !slices.Equal(got, s.wantOpen) {
						t.Errorf("at %s: open cohorts %v, want %v (decisions %+v)", s.at, got, s.wantOpen, ds)
					}
				}
				if s.wantCeiling != nil && (st.Ceiling != nil) != *s.wantCeiling {
					t.Errorf("at %s: ceiling open = %v, want %v", s.at, st.Ceiling != nil, *s.wantCeiling)
				}
				for n, want := range s.allow {
					if ok, why := Allows(st, byName[n]); ok != want {
						t.Errorf("at %s: Allows(%s) = %v (%s), want %v", s.at, n, ok, why, want)
					} else if !ok && why == "" {
						t.Errorf("at %s: Allows(%s) refused without a reason", s.at, n)
					}
				}
			}
			if !slices.Equal(trips, tt.wantTrips) {
				t.Errorf("trips %v, want %v", trips, tt.wantTrips)
			}
			for c, want := range tt.explains {
				b, ok := st.Open(c)
				if !ok {
					t.Fatalf("%s not open at the end", c)
				}
				if !reflect.DeepEqual(b.Evidence.Explains, want) {
					t.Errorf("%s explains %v, want %v", c, b.Evidence.Explains, want)
				}
			}
		})
	}
}

func checkEvidence(t *testing.T, d Decision, cfg Config) {
	t.Helper()
	ev := d.Evidence
	if ev.CohortFailing < cfg.MinFailing || ev.CohortFailing > ev.CohortNodes || ev.Log10P > math.Log10(ev.Threshold) ||
		ev.RateRatio < cfg.MinRateRatio || ev.WindowSeconds != cfg.Window.Seconds() || len(ev.Failing) == 0 ||
		ev.FirstFailure.IsZero() || ev.Tested < 1 || d.Message == "" {
		t.Errorf("trip %s carries incomplete evidence: %+v", d.Cohort, ev)
	}
}

// TestBackgroundNoise replays a day of independent lone failures in a
// 10,000-node fleet (0.05 failures per node per day, about 3.5 per window)
// with racks of 16 configured: no breaker may trip.
func TestBackgroundNoise(t *testing.T) {
	t.Parallel()
	nodes := gen(
		pool{name: "train", prefix: "t", zones: map[string]int{"a": 2000, "b": 2000, "c": 2000}, rackSize: 16, attrs: map[string]string{KeyDriverVersion: "580"}},
		pool{name: "infer", prefix: "i", zones: map[string]int{"a": 1500, "b": 1500, "c": 1000}, rackSize: 16, attrs: map[string]string{KeyDriverVersion: "570"}},
	)
	p, err := NewPolicy(Config{Labels: []string{"rack"}})
	if err != nil {
		t.Fatal(err)
	}
	fleet := p.Fleet(nodes)
	rng := rand.New(rand.NewPCG(1, 2))
	var st State
	var sigs []Signal
	perMinute := float64(len(nodes)) * 0.05 / (24 * 60)
	for m := 0; m < 24*60; m++ {
		now := t0.Add(time.Duration(m) * time.Minute)
		for k := poisson(rng, perMinute); k > 0; k-- {
			sigs = append(sigs, Signal{Node: nodes[rng.IntN(len(nodes))].Name, At: now})
		}
		var ds []Decision
		st, ds = p.Evaluate(now, fleet, sigs, st)
		if len(ds) > 0 {
			t.Fatalf("minute %d: background noise changed a breaker: %+v", m, ds)
		}
		sigs = slices.DeleteFunc(sigs, func(s Signal) bool { return now.Sub(s.At) > time.Hour })
	}
}

func poisson(rng *rand.Rand, lambda float64) int {
	l, k, p := math.Exp(-lambda), 0, 1.0
	for {
		p *= rng.Float64()
		if p <= l {
			return k
		}
		k++
	}
}

func TestEvaluateDoesNotModifyPrior(t *testing.T) {
	t.Parallel()
	p, _ := NewPolicy(Config{})
	nodes := gen(pool{name: "a", prefix: "a", zones: map[string]int{"z1": 50}}, pool{name: "b", prefix: "b", zones: map[string]int{"z2": 500}})
	fleet := p.Fleet(nodes)
	var sigs []Signal
	for i := 1; i <= 10; i++ {
		sigs = append(sigs, Signal{Node: fmt.Sprintf("a%d", i), At: t0})
	}
	st1, ds := p.Evaluate(t0, fleet, sigs, State{})
	if len(st1.Cohorts) != 1 || len(ds) != 1 {
		t.Fatalf("want one trip, got %v %+v", st1.OpenCohorts(), ds)
	}
	snapshot := fmt.Sprintf("%+v", st1)
	st2, _ := p.Evaluate(t0.Add(time.Hour), fleet, nil, st1)
	if len(st2.Cohorts) != 0 {
		t.Fatalf("want cooled down, got %v", st2.OpenCohorts())
	}
	if _, _, err := Resume(st1, "zone=z1", "x", "y", t0); err != nil {
		t.Fatal(err)
	}
	SetKillSwitch(st1, true, "x", "y", t0)
	if got := fmt.Sprintf("%+v", st1); got != snapshot {
		t.Errorf("prior state modified:\n%s\n%s", snapshot, got)
	}
}

func TestResumeErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, cohort, actor, reason string
		want                        error
	}{
		{"not open", "zone=a", "oncall", "why", ErrNotOpen},
		{"fleet not open", FleetScope, "oncall", "why", ErrNotOpen},
		{"no actor", "zone=a", "", "why", nil},
		{"no reason", "zone=a", "oncall", "", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := Resume(State{}, tt.cohort, tt.actor, tt.reason, t0)
			if err == nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("Resume = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestNewPolicyValidates(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"defaults", Config{}, ""},
		{"cool-down shorter than window", Config{Window: time.Hour, CoolDown: time.Minute}, "cool-down"},
		{"floor of one", Config{MinFailing: 1}, "minimum failing"},
		{"alpha", Config{Alpha: 2}, "alpha"},
		{"ratio", Config{MinRateRatio: 0.5}, "rate ratio"},
		{"ceiling", Config{CeilingFraction: 1.5}, "ceiling"},
		{"negative window", Config{Window: -time.Minute}, "window"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := NewPolicy(tt.cfg)
			if (err == nil) != (tt.want == "") || err != nil && !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NewPolicy(%+v) = %v, want error containing %q", tt.cfg, err, tt.want)
			}
		})
	}
}

func TestKeysPrecedence(t *testing.T) {
	t.Parallel()
	got := Config{Labels: []string{"rack", "zone", "nvlink_domain"}}.Keys()
	want := []string{KeyDriverVersion, KeyMonitoringImage, KeyKernel, KeyImage, "rack", KeyZone, "nvlink_domain",
		KeyInstanceType, KeyNodePool, KeyCluster}
	if !slices.Equal(got, want) {
		t.Errorf("Keys() = %v, want %v", got, want)
	}
}

func TestFisher(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		members, failing, total, failingTotal int
		want                                  float64
	}{
		{4, 3, 8, 4, 17.0 / 70},                 // the lady tasting tea: P(X >= 3)
		{4, 4, 8, 4, 1.0 / 70},                  // all four right
		{4, 0, 8, 4, 1},                         // nothing observed
		{3, 1, 3, 1, 1},                         // the cohort is the population
		{10, 2, 100, 2, 1.0 / 110},              // C(10,2)/C(100,2) = 45/4950
		{48, 48, 752, 48, 0},                    // 1/C(752,48): checked in log space below
		{50, 5, 1000, 20, 0.002240584042036518}, // exact sum of comb() terms (Python)
	} {
		lp := log10FisherUpper(tt.members, tt.failing, tt.total, tt.failingTotal)
		if tt.want == 0 {
			want := -lnChoose(752, 48) / math.Ln10
			if math.Abs(lp-want) > 1e-6 {
				t.Errorf("log10 p = %g, want %g", lp, want)
			}
			continue
		}
		if got := math.Pow(10, lp); math.Abs(got-tt.want) > 1e-6*max(1, tt.want) && math.Abs(got-tt.want)/tt.want > 1e-4 {
			t.Errorf("fisher(%d of %d, %d of %d) = %g, want %g", tt.failing, tt.members, tt.failingTotal, tt.total, got, tt.want)
		}
	}
	// A whole zone of a 3,000-node fleet: 1/C(3000, 1000), far below float64.
	if lp := log10FisherUpper(1000, 1000, 3000, 1000); math.Abs(lp-(-827.4926863)) > 1e-4 {
		t.Errorf("log10 p for a whole zone = %g, want -827.49", lp)
	}
	if r := jeffreysRate(0, 704); r <= 0 {
		t.Errorf("jeffreysRate(0, 704) = %g, want > 0", r)
	}
}

// TestMemory: a driver cohort whose breaker cooled down while the driver is
// still installed re-trips on its first new failure; a human resume, the
// driver leaving the fleet, or Memory passing forgets it.
func TestMemory(t *testing.T) {
	t.Parallel()
	p, err := NewPolicy(Config{})
	if err != nil {
		t.Fatal(err)
	}
	nodes := gen(
		pool{name: "render", prefix: "node-b", zones: map[string]int{"zone-a": 235, "zone-b": 235, "zone-c": 234}, attrs: map[string]string{KeyDriverVersion: "580.159.03"}},
		pool{name: "render-canary", prefix: "node-r", zones: map[string]int{"zone-a": 16, "zone-b": 16, "zone-c": 16}, attrs: map[string]string{KeyDriverVersion: "610.57.04"}},
	)
	fleet := p.Fleet(nodes)
	const cohort = "driver_version=610.57.04"
	var sigs []Signal
	fail := func(at time.Duration, ns ...string) {
		for _, n := range ns {
			sigs = append(sigs, Signal{Node: n, At: t0.Add(at)})
		}
	}
	fail(0, names("node-r", 1, 8)...)
	st, _ := p.Evaluate(t0.Add(time.Minute), fleet, sigs, State{})
	if _, ok := st.Open(cohort); !ok {
		t.Fatalf("no trip: %v", st.OpenCohorts())
	}
	st, ds := p.Evaluate(t0.Add(30*time.Minute), fleet, sigs, st)
	if _, ok := st.Open(cohort); ok || len(ds) != 1 || ds[0].Cause != CauseCooledDown {
		t.Fatalf("want a cool-down, got open %v, decisions %+v", st.OpenCohorts(), ds)
	}
	if _, ok := st.Remembered[cohort]; !ok {
		t.Fatalf("cooled-down driver cohort not remembered: %+v", st.Remembered)
	}
	// One failure two hours later, far below MinFailing: it re-trips.
	fail(2*time.Hour, "node-r20")
	st2, ds := p.Evaluate(t0.Add(2*time.Hour+time.Minute), fleet, sigs, st)
	if _, ok := st2.Open(cohort); !ok || len(ds) != 1 || ds[0].Cause != CauseRemembered {
		t.Fatalf("want a remembered re-trip, got open %v, decisions %+v", st2.OpenCohorts(), ds)
	}
	if ok, _ := Allows(st2, nodes[len(nodes)-1]); ok {
		t.Error("a node of the remembered driver may be repaired")
	}
	// A failure on another driver does not re-trip it.
	other := append(slices.Clone(sigs[:8]), Signal{Node: "node-b1", At: t0.Add(2 * time.Hour)})
	if st3, _ := p.Evaluate(t0.Add(2*time.Hour+time.Minute), fleet, other, st); len(st3.Cohorts) != 0 {
		t.Errorf("a failure outside the cohort re-tripped %v", st3.OpenCohorts())
	}
	// Memory passes: forgotten.
	late := append(slices.Clone(sigs[:8]), Signal{Node: "node-r20", At: t0.Add(25 * time.Hour)})
	if st4, _ := p.Evaluate(t0.Add(25*time.Hour+time.Minute), fleet, late, st); len(st4.Cohorts) != 0 || len(st4.Remembered) != 0 {
		t.Errorf("memory did not expire: open %v, remembered %v", st4.OpenCohorts(), st4.Remembered)
	}
	// The driver is rolled back everywhere: forgotten.
	rolled := p.Fleet(gen(pool{name: "render", prefix: "node-b", zones: map[string]int{"zone-a": 235}, attrs: map[string]string{KeyDriverVersion: "580.159.03"}}))
	if st5, _ := p.Evaluate(t0.Add(2*time.Hour+time.Minute), rolled, sigs, st); len(st5.Remembered) != 0 {
		t.Errorf("a driver no longer installed is still remembered: %v", st5.Remembered)
	}
	// A human resume forgets it.
	st6, _, err := Resume(st2, cohort, "oncall", "driver cleared by vendor", t0.Add(2*time.Hour+2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	st6, _ = p.Evaluate(t0.Add(2*time.Hour+40*time.Minute), fleet, sigs, st6)
	if _, ok := st6.Remembered[cohort]; ok {
		t.Errorf("resumed cohort is remembered: %v", st6.Remembered)
	}
	// Disabled memory: a cool-down is forgotten at once.
	off, _ := NewPolicy(Config{Memory: -1})
	st7, _ := off.Evaluate(t0.Add(time.Minute), fleet, sigs[:8], State{})
	st7, _ = off.Evaluate(t0.Add(30*time.Minute), fleet, sigs[:8], st7)
	if len(st7.Remembered) != 0 {
		t.Errorf("memory disabled but remembered %v", st7.Remembered)
	}
}

// TestReplacementFailed: a replacement failing the same way trips its
// NodePool at once, even in a three-node pool where no statistics can; a
// plain failure of the same pool does not.
func TestReplacementFailed(t *testing.T) {
	t.Parallel()
	p, err := NewPolicy(Config{})
	if err != nil {
		t.Fatal(err)
	}
	fleet := p.Fleet(gen(pool{name: "agentpool", prefix: "aks-node-", zones: map[string]int{"zone-1": 3}}))
	plain := []Signal{{Node: "aks-node-1", At: t0}}
	if st, _ := p.Evaluate(t0.Add(time.Minute), fleet, plain, State{}); st.Tripped() {
		t.Fatalf("a plain failure tripped %v", st.OpenCohorts())
	}
	rep := []Signal{{Node: "aks-node-1", At: t0, Replacement: true}}
	st, ds := p.Evaluate(t0.Add(time.Minute), fleet, rep, State{})
	if _, ok := st.Open("nodepool=agentpool"); !ok || len(ds) != 1 || ds[0].Cause != CauseReplacementFailed {
		t.Fatalf("want nodepool=agentpool tripped by the replacement, got %v %+v", st.OpenCohorts(), ds)
	}
	if ok, _ := Allows(st, Node{Name: "aks-node-2", Attrs: map[string]string{KeyNodePool: "agentpool"}}); ok {
		t.Error("another node of the pool may still be replaced")
	}
	// Outside the window it is history.
	if st, _ := p.Evaluate(t0.Add(time.Hour), fleet, rep, State{}); st.Tripped() {
		t.Errorf("an old replacement failure tripped %v", st.OpenCohorts())
	}
	off, _ := NewPolicy(Config{ReplacementFailures: -1})
	if st, _ := off.Evaluate(t0.Add(time.Minute), off.Fleet(gen(pool{name: "agentpool", prefix: "aks-node-", zones: map[string]int{"zone-1": 3}})), rep, State{}); st.Tripped() {
		t.Errorf("disabled rule tripped %v", st.OpenCohorts())
	}
}

func TestReplacementFailureRule(t *testing.T) {
	t.Parallel()
	rep := []Replaced{{Pool: "agentpool", FaultClass: "runtime", At: t0}}
	joined := t0.Add(10 * time.Minute)
	for _, tc := range []struct {
		name        string
		pool, class string
		joined, at  time.Time
		want        bool
	}{
		{"same pool, same class, half an hour after joining", "agentpool", "runtime", joined, joined.Add(30 * time.Minute), true},
		{"another fault class", "agentpool", "gpu-lost", joined, joined.Add(30 * time.Minute), false},
		{"another pool", "other", "runtime", joined, joined.Add(30 * time.Minute), false},
		{"a node that joined before the repair", "agentpool", "runtime", t0.Add(-time.Hour), t0.Add(time.Minute), false},
		{"long after joining", "agentpool", "runtime", joined, joined.Add(DefaultReplacementCycle + time.Minute), false},
	} {
		if got := ReplacementFailure(tc.pool, tc.class, tc.joined, tc.at, rep); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestSoftwareSuspects: the driver, kernel and image cohorts a node is in
// whose breaker is open or remembered; not the monitoring image, not
// placement cohorts, not another version.
func TestSoftwareSuspects(t *testing.T) {
	t.Parallel()
	st := State{
		Cohorts:    map[string]Breaker{"driver_version=610.57.04": {}, "zone=zone-a": {}, "monitoring_image=dcgm:4": {}},
		Remembered: map[string]Remembered{"kernel=6.8.0-1": {}, "driver_version=580.1": {}},
	}
	node := Node{Name: "c/n1", Attrs: map[string]string{KeyDriverVersion: "610.57.04", KeyZone: "zone-a",
		KeyMonitoringImage: "dcgm:4", KeyKernel: "6.8.0-1"}}
	got := st.SoftwareSuspects(node)
	if want := []string{"driver_version=610.57.04", "kernel=6.8.0-1"}; !slices.Equal(got, want) {
		t.Errorf("suspects %v, want %v", got, want)
	}
	if got := st.SoftwareSuspects(Node{Name: "c/n2", Attrs: map[string]string{KeyDriverVersion: "580.159.03", KeyZone: "zone-a"}}); len(got) != 0 {
		t.Errorf("node on the baseline driver: suspects %v", got)
	}
	if got := (State{}).SoftwareSuspects(node); len(got) != 0 {
		t.Errorf("no breakers: suspects %v", got)
	}
}
