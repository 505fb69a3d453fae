package simulate

import (
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/catalog"
)

var (
	newXidSinceRollbackRE = regexp.MustCompile(`^new_xid(\d+)_since_rollback$`)
	drivenByXidRE         = regexp.MustCompile(`(?i)xid (\d+)`)
)

// checkpoint evaluates one checkpoint's expect keys against fleetrepair's
// state now. Keys the simulator does not know are reported unevaluated,
// never passed.
func (r *replay) checkpoint(o occurrence, now time.Time) {
	at := fmtOffset(o.at)
	for _, key := range sortedKeys(o.step.Expect) {
		want := o.step.Expect[key]
		if n := r.byName[key]; n != nil {
			m, ok := want.(map[string]any)
			if !ok {
				r.checks = append(r.checks, Check{At: at, Key: key, Want: want, Status: StatusFail, Detail: "want a map of node expectations"})
				continue
			}
			for _, k := range sortedKeys(m) {
				r.checks = append(r.checks, r.nodeCheck(at, n, k, m[k]))
			}
			continue
		}
		if key == "breaker" {
			m, ok := want.(map[string]any)
			if !ok {
				r.checks = append(r.checks, Check{At: at, Key: key, Want: want, Status: StatusFail, Detail: "want a map"})
				continue
			}
			for _, k := range sortedKeys(m) {
				r.checks = append(r.checks, r.breakerCheck(at, k, m[k]))
			}
			continue
		}
		r.checks = append(r.checks, r.fleetCheck(at, key, want))
	}
}

func (r *replay) breakerCheck(at, k string, want any) Check {
	c := Check{At: at, Key: "breaker." + k, Want: want}
	switch k {
	case "tripped":
		c.Got = r.bstate.Tripped()
		c.Detail = fmt.Sprintf("open: %v", r.openList())
		return compare(c)
	case "cohort":
		open := r.bstate.OpenCohorts()
		c.Got = open
		c.Status = StatusFail
		if slices.Contains(open, fmt.Sprint(want)) {
			c.Status = StatusPass
		}
		return c
	case "cohort_cleared":
		var still []string
		for _, name := range r.trippedCohorts() {
			if _, open := r.bstate.Cohorts[name]; open {
				still = append(still, name)
			}
		}
		c.Got = len(still) == 0 && len(r.trippedCohorts()) > 0
		c.Detail = fmt.Sprintf("tripped so far: %v; still open: %v", r.trippedCohorts(), still)
		return compare(c)
	}
	c.Status, c.Detail = StatusUnevaluated, "unknown breaker expectation"
	return c
}

func (r *replay) openList() []string {
	out := r.bstate.OpenCohorts()
	if r.bstate.Ceiling != nil {
		out = append(out, "fleet ceiling")
	}
	if r.bstate.KillSwitch.On {
		out = append(out, "kill switch")
	}
	return out
}

// trippedCohorts lists the cohorts fleetrepair tripped so far, in order.
func (r *replay) trippedCohorts() []string {
	var out []string
	for _, t := range r.out.Trips {
		if t.Change == "open" && t.Cohort != "fleet" && !slices.Contains(out, t.Cohort) {
			out = append(out, t.Cohort)
		}
	}
	return out
}

func (r *replay) fleetCheck(at, key string, want any) Check {
	c := Check{At: at, Key: key, Want: want}
	switch key {
	case "deletions":
		c.Got = len(r.out.Deletions)
	case "deleted":
		var got []string
		for _, d := range r.out.Deletions {
			got = append(got, d.Node)
		}
		sort.Strings(got)
		var w []string
		if l, ok := want.([]any); ok {
			for _, x := range l {
				w = append(w, fmt.Sprint(x))
			}
		}
		sort.Strings(w)
		c.Got = got
		c.Status = StatusFail
		if slices.Equal(got, w) {
			c.Status = StatusPass
		}
		return c
	case "cordoned_nodes":
		n := 0
		for _, x := range r.nodes {
			if x.joined && x.head.Severity == catalog.SeverityCondition {
				n++
			}
		}
		c.Got, c.Detail = n, "nodes with a condition-severity diagnosis (condition set, NoSchedule taint)"
	case "nodes_with_hardware_fault":
		n := 0
		for _, x := range r.nodes {
			if x.joined && x.head.Severity == catalog.SeverityCondition && hardwareClass(x.head.FaultClass) {
				n++
			}
		}
		c.Got = n
	case "repair_blocked_events":
		c.Got, c.Detail = len(r.out.Paused), "repairs held by a breaker or the budget"
	case "rollout":
		var halting []string
		for _, name := range r.bstate.OpenCohorts() {
			if r.bstate.Cohorts[name].HaltRollout {
				halting = append(halting, name)
			}
		}
		got := "running"
		if len(halting) > 0 {
			got = "halted"
		}
		c.Got, c.Detail = got, fmt.Sprintf("open breakers halting a rollout: %v", halting)
	default:
		if m := newXidSinceRollbackRE.FindStringSubmatch(key); m != nil {
			xid, _ := strconv.Atoi(m[1])
			if !r.reverted {
				c.Status, c.Detail = StatusFail, "no rollback (a change back to an earlier value) happened"
				return c
			}
			n := 0
			for _, t := range r.xidsAfter[xid] {
				if t > r.lastRevert {
					n++
				}
			}
			c.Got, c.Detail = n, fmt.Sprintf("Xid %d findings injected after the rollback at %s", xid, fmtOffset(r.lastRevert))
			break
		}
		c.Status, c.Detail = StatusUnevaluated, "unknown expectation key"
		return c
	}
	return compare(c)
}

func (r *replay) nodeCheck(at string, n *simNode, k string, want any) Check {
	c := Check{At: at, Key: n.name + "." + k, Want: want}
	h := n.head
	switch k {
	case "severity":
		c.Got = string(h.Severity)
	case "fault_class":
		c.Got = h.FaultClass
	case "action":
		c.Got = string(h.Action)
		if h.Escalated {
			c.Detail = h.Message
		}
	case "deletions":
		c.Got = n.deletions
	case "open_conditions":
		k := 0
		for _, d := range n.diags {
			if d.Severity == catalog.SeverityCondition {
				k++
			}
		}
		c.Got = k
	case "monitor_state":
		switch {
		case n.monitorDown:
			c.Got = "unknown"
		case h.Severity == catalog.SeverityCondition:
			c.Got = "failing"
		default:
			c.Got = "ok"
		}
	case "incidents_on_gpu":
		c.Got = r.incidentsOnGPU(n)
		c.Detail = fmt.Sprintf("bursts of findings on %v separated by more than %s", h.GPUs, incidentGap)
	case "driven_by":
		m := drivenByXidRE.FindStringSubmatch(fmt.Sprint(want))
		if m == nil {
			c.Status, c.Detail = StatusUnevaluated, "driven_by is evaluated only for \"... Xid N\""
			return c
		}
		xid, _ := strconv.Atoi(m[1])
		c.Got = h.Evidence
		c.Status = StatusFail
		for _, f := range n.findings {
			if f.Detector == "xid" && f.Xid == xid && slices.Contains(h.FindingIDs, f.ID) {
				c.Status = StatusPass
			}
		}
		return c
	case "new_xid_events_from_metric":
		k := 0
		for _, d := range n.diags {
			for _, f := range n.findings {
				if f.Detector == "dcgm-metric" && slices.Contains(d.FindingIDs, f.ID) {
					k++
					break
				}
			}
		}
		c.Got, c.Detail = k, "diagnoses that include a dcgm-metric finding"
	default:
		c.Status, c.Detail = StatusUnevaluated, "unknown node expectation key"
		return c
	}
	return compare(c)
}

// incidentsOnGPU counts bursts of injected findings on the headline's GPUs
// over the machine's life (every boot), a burst ending after incidentGap of
// quiet.
func (r *replay) incidentsOnGPU(n *simNode) int {
	var ts []time.Time
	for _, in := range n.injected {
		if in.gpu != "" && slices.Contains(n.head.GPUs, in.gpu) {
			ts = append(ts, in.at)
		}
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	k := 0
	for i, t := range ts {
		if i == 0 || t.Sub(ts[i-1]) > incidentGap {
			k++
		}
	}
	return k
}

// compare sets c.Status from Want and Got: numbers by value, everything
// else by its printed form.
func compare(c Check) Check {
	eq := false
	switch w := c.Want.(type) {
	case float64:
		switch g := c.Got.(type) {
		case int:
			eq = float64(g) == w
		case float64:
			eq = g == w
		}
	case bool:
		g, ok := c.Got.(bool)
		eq = ok && g == w
	default:
		eq = reflect.DeepEqual(fmt.Sprint(c.Want), fmt.Sprint(c.Got))
	}
	c.Status = StatusFail
	if eq {
		c.Status = StatusPass
	}
	return c
}

// expectations checks the scenario-level breaker outcome on fleetrepair's
// run: whether a breaker tripped, that every cohort trip names the expected
// cohort, and the deletion bound.
func expectations(sc *Scenario, r *replay) []Check {
	e := sc.Expect
	if e == nil {
		return nil
	}
	var trips, cohorts []string
	for _, t := range r.out.Trips {
		if t.Change != "open" {
			continue
		}
		trips = append(trips, t.Cohort)
		if t.Cohort != "fleet" {
			cohorts = append(cohorts, t.Cohort)
		}
	}
	out := []Check{compare(Check{Key: "breaker.expect_trip", Want: e.ExpectTrip, Got: len(trips) > 0,
		Detail: fmt.Sprintf("trips: %v", trips)})}
	if e.ExpectTrip && e.Cohort != "" {
		c := Check{Key: "breaker.cohort", Want: e.Cohort, Got: cohorts, Status: StatusFail}
		if len(cohorts) > 0 {
			c.Status = StatusPass
			for _, x := range cohorts {
				if x != e.Cohort {
					c.Status, c.Detail = StatusFail, "another cohort tripped too"
				}
			}
		}
		out = append(out, c)
	}
	if e.MaxDeletions != nil {
		c := Check{Key: "breaker.max_deletions", Want: *e.MaxDeletions, Got: len(r.out.Deletions), Status: StatusFail}
		if len(r.out.Deletions) <= *e.MaxDeletions {
			c.Status = StatusPass
		}
		out = append(out, c)
	}
	return out
}
