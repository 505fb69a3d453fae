package shadow_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

func TestDump(t *testing.T) {
	f := newFleet(t)
	for i := range 10 {
		f.node(fmt.Sprintf("z1-%02d", i), "train", "z1", fmt.Sprintf("nc-z1-%d", i))
	}
	for i := range 40 {
		f.node(fmt.Sprintf("quiet-%02d", i), "train", []string{"z2", "z3"}[i%2], fmt.Sprintf("nc-q%d", i))
	}
	for i := range 6 {
		at := t0.Add(30*time.Minute + time.Duration(i)*10*time.Second)
		f.xid(fmt.Sprintf("z1-%02d", i), 79, at, at)
	}
	f.xid("quiet-01", 13, time.Time{}, t0.Add(90*time.Minute))
	rep := run(t, config(t, f.st), t0.Add(27*time.Hour))
	b, _ := json.MarshalIndent(rep, "", "  ")
	t.Log(string(b))
}
