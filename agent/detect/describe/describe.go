// Package describe reads the Capacity and Allocatable blocks of saved
// "kubectl describe node" output: a GPU resource whose allocatable count is
// below its capacity (nvidia.com/gpu 7 of 8) means the device plugin
// withholds GPUs it marked unhealthy (c14: after an Xid 94 the plugin keeps
// one GPU unhealthy for good). That is a device-plugin finding with attr
// withheld_gpus, never a GPU missing from the bus (capacity still counts it).
//
// Findings carry no node or ID; detect.Stamp completes them. The rest of a
// describe output (condition and event messages) is runtimelog's.
package describe

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// gpuResource matches the extended resources that count GPUs: the NVIDIA
// device plugin's nvidia.com/gpu and its MIG and shared variants
// (nvidia.com/mig-1g.10gb, nvidia.com/gpu.shared), and AMD's amd.com/gpu.
var gpuResource = regexp.MustCompile(`^(?:nvidia\.com/(?:gpu(?:\.shared)?|mig-[\w.-]+)|amd\.com/gpu)$`)

// Stats counts what Parse read.
type Stats struct {
	Lines int // lines read
	// Blocks is the number of Capacity and Allocatable blocks seen (2 for
	// one node's output).
	Blocks int
}

// Parse reads describe output and returns one device-plugin finding per GPU
// resource whose allocatable count is below its capacity (attrs resource,
// capacity, allocatable, withheld_gpus). A count that is not a whole number
// in 0..finding.MaxCount is an error naming the line (never truncated).
// Errors: reading r, and such a count.
func Parse(r io.Reader) ([]finding.Finding, Stats, error) {
	var st Stats
	blocks := map[string]map[string]int{} // "Capacity"/"Allocatable" -> resource -> count
	lines := map[string]string{}          // block|resource -> the line, for evidence
	var order []string                    // GPU resources in capacity order
	block := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		st.Lines++
		if line == "Capacity:" || line == "Allocatable:" {
			block = strings.TrimSuffix(line, ":")
			blocks[block] = map[string]int{}
			st.Blocks++
			continue
		}
		if block == "" {
			continue
		}
		if !strings.HasPrefix(line, " ") {
			block = "" // the next section ("System Info:", ...)
			continue
		}
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !gpuResource.MatchString(name) {
			continue
		}
		value = strings.TrimSpace(value)
		n, err := finding.ParseNumber(name, value, 0, finding.MaxCount)
		if err != nil {
			return nil, st, fmt.Errorf("read %s %s, line %d: %w", block, name, st.Lines, err)
		}
		blocks[block][name] = n
		lines[block+"|"+name] = line
		if block == "Capacity" && !slices.Contains(order, name) {
			order = append(order, name)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, st, fmt.Errorf("read describe output: %w", err)
	}
	var out []finding.Finding
	for _, res := range order {
		c := blocks["Capacity"][res]
		a, ok := blocks["Allocatable"][res]
		if !ok || a >= c {
			continue
		}
		out = append(out, finding.Finding{Detector: finding.DetectorDevicePlugin, Count: 1,
			Attrs: map[string]string{finding.AttrWithheldGPUs: strconv.Itoa(c - a), finding.AttrResource: res,
				finding.AttrCapacity: strconv.Itoa(c), finding.AttrAllocatable: strconv.Itoa(a)},
			Evidence: []string{"Capacity: " + strings.TrimSpace(lines["Capacity|"+res]), "Allocatable: " + strings.TrimSpace(lines["Allocatable|"+res])}})
	}
	return out, st, nil
}
