package detect

import "github.com/fleetrepair/fleetrepair/agent/finding"

// Stamp completes a finding made outside the kernel Detector (tool outputs,
// NVML, DCGM, the container runtime): it sets the node and boot ID, raises
// Count to at least 1, drops an empty Attrs map and computes the ID last, so
// that the same observation always gets the same ID.
func Stamp(f finding.Finding, node, bootID string) finding.Finding {
	f.Node, f.BootID = node, bootID
	if f.Count < 1 {
		f.Count = 1
	}
	if len(f.Attrs) == 0 {
		f.Attrs = nil
	}
	f.ID = finding.NewID(f)
	return f
}
