package breaker

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// benchFleet returns n nodes over 3 zones, pools nodepools, 4 instance
// types, 3 driver versions, 2 monitoring images and, with racks, racks of 16,
// plus the signals of a background failure rate (failing nodes in the
// window) and, when wave is set, one rack and one driver rollout failing.
func benchFleet(n, pools, failing int, racks, wave bool) ([]Node, []Signal) {
	rng := rand.New(rand.NewPCG(7, 7))
	nodes := make([]Node, n)
	for i := range nodes {
		nodes[i] = Node{Name: fmt.Sprintf("n%d", i), Attrs: map[string]string{
			KeyCluster: "c1", KeyZone: fmt.Sprintf("z%d", i%3), KeyNodePool: fmt.Sprintf("p%d", i%pools),
			KeyInstanceType: fmt.Sprintf("it%d", i%4), KeyDriverVersion: fmt.Sprintf("d%d", i%3),
			KeyMonitoringImage: fmt.Sprintf("m%d", i%2),
		}}
		if racks {
			nodes[i].Attrs["rack"] = fmt.Sprintf("r%d", i/16)
		}
	}
	var sigs []Signal
	for range failing {
		sigs = append(sigs, Signal{Node: nodes[rng.IntN(n)].Name, At: t0.Add(-time.Duration(rng.IntN(600)) * time.Second)})
	}
	if wave {
		for i := 160; i < 176; i++ { // rack r10
			sigs = append(sigs, Signal{Node: nodes[i].Name, At: t0.Add(-time.Minute)})
		}
		for i := 0; i < n; i += 3 * 29 { // a third of driver d0 nodes, spread
			nodes[i].Attrs[KeyDriverVersion] = "d-new"
			sigs = append(sigs, Signal{Node: nodes[i].Name, At: t0.Add(-2 * time.Minute)})
		}
	}
	return nodes, sigs
}

// BenchmarkEvaluate measures one breaker evaluation (the periodic decision)
// on a prepared Fleet index; BenchmarkFleet measures building the index,
// needed only when node metadata changes.
func BenchmarkEvaluate(b *testing.B) {
	for _, bc := range []struct {
		nodes, pools, failing int
		racks, wave           bool
	}{
		{10_000, 36, 5, false, false}, // about 50 cohorts
		{10_000, 36, 5, false, true},
		{10_000, 10, 5, true, false}, // racks of 16: about 650 cohorts
		{10_000, 10, 5, true, true},
		{100_000, 10, 50, true, false},
		{100_000, 10, 50, true, true},
	} {
		b.Run(fmt.Sprintf("nodes=%d/racks=%v/background=%d/wave=%v", bc.nodes, bc.racks, bc.failing, bc.wave), func(b *testing.B) {
			nodes, sigs := benchFleet(bc.nodes, bc.pools, bc.failing, bc.racks, bc.wave)
			p, _ := NewPolicy(Config{Labels: []string{"rack"}})
			fleet := p.Fleet(nodes)
			// Open breakers from a first evaluation, so the benchmark includes
			// the explained-population pass of a fleet with open breakers.
			st, _ := p.Evaluate(t0, fleet, sigs, State{})
			b.ReportAllocs()
			for b.Loop() {
				p.Evaluate(t0, fleet, sigs, st)
			}
			b.ReportMetric(float64(len(fleet.cohorts)), "cohorts")
			b.ReportMetric(float64(len(sigs)), "signals")
			b.ReportMetric(float64(len(st.Cohorts)), "open")
		})
	}
}

func BenchmarkFleet(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		nodes, _ := benchFleet(n, 10, 0, true, false)
		p, _ := NewPolicy(Config{Labels: []string{"rack"}})
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p.Fleet(nodes)
			}
		})
	}
}

func BenchmarkAllows(b *testing.B) {
	nodes, sigs := benchFleet(100_000, 10, 50, true, true)
	p, _ := NewPolicy(Config{Labels: []string{"rack"}})
	st, _ := p.Evaluate(t0, p.Fleet(nodes), sigs, State{})
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		Allows(st, nodes[i%len(nodes)])
		i++
	}
}
