package describe

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	in := `Name:               node-a1
Capacity:
  cpu:                        128
  nvidia.com/gpu:             8
  nvidia.com/mig-1g.10gb:     14
  pods:                       110
Allocatable:
  cpu:                        127
  nvidia.com/gpu:             7
  nvidia.com/mig-1g.10gb:     14
  pods:                       110
System Info:
  Machine ID:                 abc
`
	fs, st, err := Parse(strings.NewReader(in))
	if err != nil || st.Blocks != 2 {
		t.Fatalf("Parse: %v, stats %+v", err, st)
	}
	if len(fs) != 1 {
		t.Fatalf("findings %+v, want one (nvidia.com/gpu 7 of 8; cpu is no GPU, MIG is whole)", fs)
	}
	f := fs[0]
	if f.Detector != "device-plugin" || f.Attrs["withheld_gpus"] != "1" || f.Attrs["resource"] != "nvidia.com/gpu" ||
		f.Attrs["capacity"] != "8" || f.Attrs["allocatable"] != "7" || len(f.Evidence) != 2 {
		t.Errorf("finding %+v", f)
	}
	// Allocatable at capacity, or no Allocatable block: nothing.
	for _, ok := range []string{"Capacity:\n  nvidia.com/gpu:  8\nAllocatable:\n  nvidia.com/gpu:  8\n", "Capacity:\n  nvidia.com/gpu:  8\n"} {
		if fs, _, err := Parse(strings.NewReader(ok)); err != nil || len(fs) != 0 {
			t.Errorf("%q: %+v, %v; want nothing", ok, fs, err)
		}
	}
	// An oversized count is an error, not a number cut short.
	bad := "Capacity:\n  nvidia.com/gpu:  99999999999999999999\nAllocatable:\n  nvidia.com/gpu:  7\n"
	if _, _, err := Parse(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("oversized capacity: err %v, want out of range", err)
	}
}
