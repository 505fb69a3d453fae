package shadow_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

func TestPerf(t *testing.T) {
	f := newFleet(t)
	const N = 2000
	for i := range N {
		f.node(fmt.Sprintf("n%04d", i), fmt.Sprintf("p%d", i%4), fmt.Sprintf("z%d", i%3), fmt.Sprintf("nc-%d", i))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		at := t0.Add(time.Duration(rng.Int64N(int64(168 * time.Hour))))
		x := []int{79, 13, 31, 109, 48}[i%5]
		f.xid(fmt.Sprintf("n%04d", rng.IntN(N)), x, at, at)
	}
	start := time.Now()
	rep := run(t, config(t, f.st), t0.Add(168*time.Hour))
	t.Logf("replay %s: nodes %d findings %d deletions %d approvals %d trips %d", time.Since(start), rep.Nodes, rep.Findings, len(rep.Deletions), len(rep.ApprovalsNeeded), len(rep.Trips))
}
