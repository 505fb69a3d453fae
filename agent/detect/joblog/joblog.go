// Package joblog turns a workload's own log (a training job's or a pod's
// output: NCCL, CUDA and framework lines) into findings about the network
// path it used: NCCL's NET/IB completion errors, which name the reporting
// host, its local NIC (by GID, or by HCA name in newer NCCL) and the peer.
//
// A job log says what one job saw on one path; it is not a verdict on a
// node. The controller files it as an event against both endpoints and
// raises a condition only when the same node and NIC fail across several
// jobs and peers (controller/diagnose).
//
// Findings carry no node or ID; detect.Stamp completes them.
package joblog

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

var (
	// ncclPrefix is NCCL's line prefix "host:pid:tid [cudaDev]", optionally
	// after a timestamp in brackets (c29).
	ncclPrefix = regexp.MustCompile(`^(?:\[([^\]]*)\]\s*)?([\w.-]+):(\d+):(\d+) \[(\d+)\]`)
	// completion is the NET/IB completion error of every NCCL release:
	//	NET/IB : Got completion from peer 10.0.2.36<54862> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ... remoteGids...
	//	NET/IB : Got completion from peer 10.0.0.1<12345> with error 12, opcode 0, len 0, vendor err 129 (Recv)
	completion = regexp.MustCompile(`NCCL WARN NET/IB\s*: Got completion from peer ([^<\s,]+)(?:<\d+>)? with (?:status=|error )(\d+)`)
	vendorErr  = regexp.MustCompile(`vendor err (\d+)`)
	localGid   = regexp.MustCompile(`localGid\s*(\S+)`)
	remoteGid  = regexp.MustCompile(`remoteGids?\s*(\S+)`)
	hcaName    = regexp.MustCompile(`\bhca (\S+)`)
	direction  = regexp.MustCompile(`vendor err \d+ \((\w+)\)`)
	// asyncEvent is NCCL reporting an asynchronous IB event on its device
	// ("NET/IB : Got async event : port error", "... GID table change").
	asyncEvent = regexp.MustCompile(`NCCL WARN NET/IB\s*: Got async event\s*:\s*(.*?)\s*$`)
)

// Stats count what Parse saw.
type Stats struct {
	Lines   int
	Matched int
}

// Parse reads a job log and returns its findings in order of first
// appearance. Completion errors of the same host, peer, status, vendor error
// and HCA are one finding (Count: how many), with the GIDs they named.
func Parse(r io.Reader) ([]finding.Finding, Stats, error) {
	var (
		st    Stats
		out   []finding.Finding
		index = map[string]int{}
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		st.Lines++
		f, key, ok := parseLine(line)
		if !ok {
			continue
		}
		st.Matched++
		if i, seen := index[key]; seen {
			g := &out[i]
			g.Count++
			if len(g.Evidence) < 16 {
				g.Evidence = append(g.Evidence, line)
			}
			for _, k := range []string{finding.AttrLocalGIDs, finding.AttrRemoteGIDs} {
				g.Attrs[k] = union(g.Attrs[k], f.Attrs[k])
				if g.Attrs[k] == "" {
					delete(g.Attrs, k)
				}
			}
			continue
		}
		index[key] = len(out)
		out = append(out, f)
	}
	if err := sc.Err(); err != nil {
		return out, st, fmt.Errorf("read job log: %w", err)
	}
	return out, st, nil
}

// parseLine reads one NCCL net error line and its grouping key.
func parseLine(line string) (finding.Finding, string, bool) {
	attrs := map[string]string{}
	var at time.Time
	if m := ncclPrefix.FindStringSubmatch(line); m != nil {
		attrs[finding.AttrHost] = m[2]
		if t, err := time.Parse("2006-01-02 15:04:05", m[1]); err == nil {
			at = t.UTC()
		}
	}
	switch m := completion.FindStringSubmatch(line); {
	case m != nil:
		attrs[finding.AttrPeer], attrs[finding.AttrStatus] = m[1], m[2]
		for re, k := range map[*regexp.Regexp]string{vendorErr: finding.AttrVendorErr, localGid: finding.AttrLocalGIDs,
			remoteGid: finding.AttrRemoteGIDs, hcaName: finding.AttrHCA, direction: "direction"} {
			if v := re.FindStringSubmatch(line); v != nil {
				attrs[k] = v[1]
			}
		}
	default:
		a := asyncEvent.FindStringSubmatch(line)
		if a == nil {
			return finding.Finding{}, "", false
		}
		attrs[finding.AttrError] = a[1]
	}
	f := finding.Finding{Detector: finding.DetectorNCCLNetError, Time: at, Count: 1, Attrs: attrs, Evidence: []string{line}}
	key := strings.Join([]string{attrs[finding.AttrHost], attrs[finding.AttrPeer], attrs[finding.AttrStatus],
		attrs[finding.AttrVendorErr], attrs[finding.AttrHCA], attrs[finding.AttrError]}, "\x00")
	return f, key, true
}

// union merges two comma-separated lists, first occurrence first.
func union(a, b string) string {
	var items []string
	for _, s := range []string{a, b} {
		for _, it := range strings.Split(s, ",") {
			if it != "" && !slices.Contains(items, it) {
				items = append(items, it)
			}
		}
	}
	return strings.Join(items, ",")
}
