package shadow_test

import (
	"fmt"
	"testing"
	"time"
)

func TestPerfTmp(t *testing.T) {
	f := newFleet(t)
	for i := range 50 {
		f.node(fmt.Sprintf("n%04d", i), fmt.Sprintf("p%d", i%4), fmt.Sprintf("z%d", i%3), fmt.Sprintf("nc-%d", i))
	}
	for i := range 5000 {
		at := t0.Add(time.Duration(i) * 2 * time.Minute)
		f.xid("n0001", 13, at, at)
	}
	start := time.Now()
	rep := run(t, config(t, f.st), t0.Add(168*time.Hour))
	t.Logf("replay %s: findings %d", time.Since(start), rep.Findings)
}
