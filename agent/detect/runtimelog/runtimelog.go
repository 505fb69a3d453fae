// Package runtimelog turns the logs of the node's runtime components into
// findings: the kubelet (PLEG stalls, container kills that time out), the
// NVIDIA device plugin and pod admission failures it causes, and agents
// whose own data source is gone (DCGM's host engine, NVML).
//
// Lines may come in any of the renderings found on a node or in a bug
// report: journald/syslog ("Mar 13 16:02:43 node-a1 kubelet[1450]: I0313
// ..."), bare glog ("I1025 02:19:08.002792 1 health.go:151] ..."), JSON log
// lines (possibly cut off), or a bare Kubernetes Event message. Rules look at
// the message text, so the rendering does not matter. Lines that match no
// rule produce nothing: informational lines of nvidia-container-cli or the
// device plugin are not errors.
//
// Findings carry no node or ID; detect.Stamp completes them.
package runtimelog

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/detect/jsonlog"
	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
)

// PLEGGap is the longest pause between two "PLEG is not healthy" lines that
// still belong to one ongoing stall; the kubelet repeats the line every 5 s
// while the stall lasts.
const PLEGGap = 2 * time.Minute

var (
	pleg = regexp.MustCompile(`PLEG is not healthy: pleg was last seen active ([0-9][0-9hmsuµn.]*) ago; threshold is ([0-9][0-9hmsuµn.]*)`)
	// allocFailed is the kubelet's pod admission failure when the device
	// plugin's Allocate / GetPreferredAllocation call fails.
	allocFailed = regexp.MustCompile(`device plugin (\w+) rpc failed with err: (.*)$`)
	nvmlDevice  = regexp.MustCompile(`nvml\.Device (\d+): nvml: ([A-Za-z][A-Za-z ]*[A-Za-z])`)
	// xidCritical is the device plugin marking a GPU unhealthy after a critical Xid.
	xidCritical = regexp.MustCompile(`XidCriticalError: Xid=(\d+) on Device=([^,\s]+)`)
	// killTimeout is the kubelet (or CRI) failing to kill a container in time.
	killTimeout = regexp.MustCompile(`(?i)(?:error killing pod|KillContainer|StopContainer|KillPodSandbox|StopPodSandbox).*(?:DeadlineExceeded|context deadline exceeded)`)
	// dcgmDown and nvmlDown are an agent's own data source failing.
	dcgmDown = regexp.MustCompile(`(?i)(Error connecting to nv-hostengine[^"\n]*|libdcgm\.so[.0-9]* not found[^"\n]*|Host engine connection invalid[^"\n]*)`)
	nvmlDown = regexp.MustCompile(`(?i)(Failed to initialize NVML[^"\n]*|libnvidia-ml\.so[.0-9]*[^"\n]*not found[^"\n]*)`)
	// versionMismatch is NVML's NVML_ERROR_LIB_RM_VERSION_MISMATCH in every
	// spelling its clients log: nvidia-smi and NVML ("Driver/library version
	// mismatch"), nvidia-container-cli in a prestart hook ("nvml error:
	// driver/library version mismatch", c24), the Go bindings
	// ("ERROR_LIB_RM_VERSION_MISMATCH"). Not a monitoring problem: the loaded
	// kernel module and the user-space driver differ, and every new GPU
	// container fails.
	versionMismatch = regexp.MustCompile(`(?i)(driver/library version mismatch|ERROR_LIB_RM_VERSION_MISMATCH|RM_VERSION_MISMATCH)`)

	// notReady is the kubelet's Ready condition as "kubectl describe node"
	// prints it: the table row ("Ready False <times> KubeletNotReady msg")
	// or its reason and message alone (c28); NodeStatusUnknown is the node
	// lifecycle controller's "Kubelet stopped posting node status".
	notReadyRow = regexp.MustCompile(`^\s*Ready\s+(False|Unknown)\s+.*?\s(KubeletNotReady|NodeStatusUnknown)\s+(.*?)\s*$`)
	// conditionRow is any row of the Conditions table of "kubectl describe
	// node": Type, Status, LastHeartbeatTime, LastTransitionTime (RFC 1123
	// with a numeric zone, kubectl's rendering), Reason, Message. Other
	// agents' conditions (node-problem-detector's KernelDeadlock,
	// ReadonlyFilesystem; the EKS agent's AcceleratedHardwareReady) come
	// this way; the controller reads each with the same rule as a live
	// Node's (controller/diagnose/conditions.go ReadCondition).
	conditionRow = regexp.MustCompile(`^\s*([A-Z][A-Za-z0-9]+)\s+(True|False|Unknown)\s+(\w{3}, \d{2} \w{3} \d{4} \d\d:\d\d:\d\d [+-]\d{4})\s+(\w{3}, \d{2} \w{3} \d{4} \d\d:\d\d:\d\d [+-]\d{4})\s+(\S+)(?:\s+(.*?))?\s*$`)
	// nodeNotReadyEvent is the node lifecycle controller's Event
	// ("Node node-a1 status is now: NodeNotReady"), as "kubectl get events"
	// or "describe node" prints it.
	nodeNotReadyEvent = regexp.MustCompile(`Node \S+ status is now: NodeNotReady`)
	notReady          = regexp.MustCompile(`(?:^|\s)(KubeletNotReady|NodeStatusUnknown)\s{2,}(.*?)\s*$`)
	// rpcDeadline is a CRI call the runtime did not answer in time
	// ("failed to get image stats: rpc error: code = DeadlineExceeded"); the
	// kubelet logs the bare rpc error after it: one stall.
	rpcDeadline = regexp.MustCompile(`rpc error: code = DeadlineExceeded`)
	// runtimeGone is the runtime's socket refusing connections.
	dockerGone     = regexp.MustCompile(`Cannot connect to the Docker daemon at (\S+?)\.?(?:\s|$)`)
	runtimeSockErr = regexp.MustCompile(`dial unix (\S*(?:containerd|crio|docker|cri-dockerd)\S*\.sock)`)
	// fmSwitchErr is Fabric Manager's log of an NVSwitch error
	// (/var/log/fabricmanager.log): "detected NVSwitch non-fatal error 12028
	// on fid 0 on NVSwitch pci bus id 00000000:07:00.0 physical id 2 port 62".
	fmSwitchErr = regexp.MustCompile(`(?i)detected NVSwitch (non-fatal|fatal) error (\d+) on fid \d+ on NVSwitch pci bus id ([0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])(?: physical id \d+)?(?: port (\d+))?`)
	// cudaNotReady is CUDA's cudaErrorSystemNotReady (802) as frameworks
	// log it: on an NVSwitch system the GPUs are not on the fabric (Fabric
	// Manager not running or not done).
	cudaNotReady = regexp.MustCompile(`(?i)(?:error 802|CUDA error: system not yet initialized|cudaErrorSystemNotReady)`)
	syslogTime   = regexp.MustCompile(`^([A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d)\s`)
	glogTime     = regexp.MustCompile(`(?:^|\s)[IWEF](\d{4} \d\d:\d\d:\d\d\.\d+)\s`)
)

// Stats count what Parse saw.
type Stats struct {
	Lines   int // records read (JSON records with wrapped lines joined)
	Matched int // records that fed a finding
}

// Parse reads a runtime log and returns its findings, in order of first
// appearance. Repeated lines of one condition are grouped: a PLEG stall is
// one finding (Count = its lines, last_seen_active_max the longest), and
// the same error from the same component is one finding with a Count.
func Parse(r io.Reader) ([]finding.Finding, Stats, error) {
	var st Stats
	recs, err := records(r)
	if err != nil {
		return nil, st, err
	}
	p := &parser{byKey: map[string]int{}, now: time.Now()}
	for _, rec := range recs {
		st.Lines++
		if p.line(rec) {
			st.Matched++
		}
	}
	p.closePLEG()
	return p.out, st, nil
}

// records returns JSON records (wrapped lines joined) when the input is a
// JSON log, else its lines.
func records(r io.Reader) ([]string, error) {
	br := bufio.NewReader(r)
	head, _ := br.Peek(512)
	if t := strings.TrimSpace(string(head)); strings.HasPrefix(t, "{") {
		return jsonlog.Records(br)
	}
	var out []string
	sc := bufio.NewScanner(br)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		if l := strings.TrimRight(sc.Text(), "\r"); strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("read runtime log: %w", err)
	}
	return out, nil
}

type parser struct {
	now   time.Time // completes the year of syslog and glog times (kmsg.CompleteYear)
	out   []finding.Finding
	byKey map[string]int // grouping key -> index in out

	plegIdx  int // index in out of the open PLEG stall, valid while plegOpen
	plegMax  time.Duration
	plegLast time.Time
	plegOpen bool
}

// add appends f, or counts it into the finding with the same key.
func (p *parser) add(key string, f finding.Finding) {
	if i, ok := p.byKey[key]; ok {
		p.out[i].Count++
		if len(p.out[i].Evidence) < 16 {
			p.out[i].Evidence = append(p.out[i].Evidence, f.Evidence...)
		}
		return
	}
	f.Count = 1
	p.byKey[key] = len(p.out)
	p.out = append(p.out, f)
}

func (p *parser) line(rec string) bool {
	at := lineTime(rec, p.now)
	matched := false
	if m := conditionRow.FindStringSubmatch(rec); m != nil && m[1] != "Ready" {
		p.condition(rec, m)
		matched = true
	} else if m := notReadyRow.FindStringSubmatch(rec); m != nil {
		p.notReady(rec, at, m[1], m[2], m[3])
		matched = true
	} else if nodeNotReadyEvent.MatchString(rec) {
		p.notReady(rec, at, "Unknown", "NodeNotReady", "")
		matched = true
	} else if m := notReady.FindStringSubmatch(rec); m != nil {
		status := "False"
		if m[1] == "NodeStatusUnknown" {
			status = "Unknown"
		}
		p.notReady(rec, at, status, m[1], m[2])
		matched = true
	}
	return p.rest(rec, at) || matched
}

// notReady records the kubelet's Ready condition (not True).
func (p *parser) notReady(rec string, at time.Time, status, reason, msg string) {
	p.add("ready\x00"+status+"\x00"+reason, finding.Finding{Detector: finding.DetectorNodeCondition, Time: at,
		Attrs:    map[string]string{"type": "Ready", "status": status, "reason": reason, "message": msg},
		Evidence: []string{rec}})
}

// condition records a row of "describe node"'s Conditions table other than
// Ready (read by notReady): its time is the row's LastTransitionTime (when
// the status was set), its last_heartbeat the LastHeartbeatTime (freshness).
// Rows in every status are kept: whether a status is bad is the
// controller's decision, and a type it does not know is counted there.
func (p *parser) condition(rec string, m []string) {
	attrs := map[string]string{"type": m[1], "status": m[2], "reason": m[5], "message": m[6]}
	if hb, err := time.Parse(time.RFC1123Z, m[3]); err == nil {
		attrs[finding.AttrHeartbeat] = hb.UTC().Format(time.RFC3339)
	}
	at, _ := time.Parse(time.RFC1123Z, m[4])
	p.add("condition\x00"+m[1]+"\x00"+m[2]+"\x00"+m[5], finding.Finding{Detector: finding.DetectorNodeCondition,
		Time: at.UTC(), Attrs: attrs, Evidence: []string{rec}})
}

// stall records a runtime error that is one ongoing stall however many lines
// report it: Count stays 1, lines counts them.
func (p *parser) stall(key string, f finding.Finding) {
	if i, ok := p.byKey[key]; ok {
		g := &p.out[i]
		n, _ := strconv.Atoi(g.Attrs[finding.AttrLines])
		g.Attrs[finding.AttrLines] = strconv.Itoa(max(n, 1) + 1)
		if len(g.Evidence) < 16 {
			g.Evidence = append(g.Evidence, f.Evidence...)
		}
		return
	}
	f.Count = 1
	p.byKey[key] = len(p.out)
	p.out = append(p.out, f)
}

// rest runs the other rules on a record.
func (p *parser) rest(rec string, at time.Time) bool {
	if m := dockerGone.FindStringSubmatch(rec); m != nil {
		e := "Cannot connect to the Docker daemon at " + m[1]
		p.stall("rtgone\x00"+e, finding.Finding{Detector: finding.DetectorRuntimeWedge, Time: at,
			Attrs:    map[string]string{finding.AttrComponent: "container-runtime", finding.AttrError: e},
			Evidence: []string{rec}})
		return true
	}
	if m := runtimeSockErr.FindStringSubmatch(rec); m != nil {
		e := "cannot connect to " + m[1]
		p.stall("rtgone\x00"+e, finding.Finding{Detector: finding.DetectorRuntimeWedge, Time: at,
			Attrs:    map[string]string{finding.AttrComponent: "container-runtime", finding.AttrError: e},
			Evidence: []string{rec}})
		return true
	}
	if m := pleg.FindStringSubmatch(rec); m != nil {
		p.plegLine(rec, at, m[1], m[2])
		return true
	}
	if m := allocFailed.FindStringSubmatch(rec); m != nil {
		cause := strings.TrimSpace(m[2])
		attrs := map[string]string{}
		if n := nvmlDevice.FindStringSubmatch(cause); n != nil {
			attrs[finding.AttrNVMLIndex] = n[1]
			cause = "nvml device " + n[1] + " " + strings.TrimPrefix(strings.ToLower(n[2]), "gpu ")
		} else if len(cause) > 120 {
			cause = cause[:120]
		}
		attrs[finding.AttrError] = m[1] + " failed (" + cause + ")"
		p.add("dp\x00"+attrs[finding.AttrError], finding.Finding{Detector: finding.DetectorDevicePlugin, Time: at,
			Attrs: attrs, Evidence: []string{rec}})
		return true
	}
	if m := xidCritical.FindStringSubmatch(rec); m != nil {
		xid, err := finding.ParseNumber("xid", m[1], 1, finding.MaxXid)
		if err != nil {
			return false // an out-of-range Xid: the line is not read, never cut short
		}
		p.add("xidc\x00"+m[1]+"\x00"+m[2], finding.Finding{Detector: finding.DetectorDevicePlugin, Time: at, Xid: xid,
			Attrs:    map[string]string{finding.AttrGPUUUID: m[2], finding.AttrError: "device marked unhealthy after Xid " + m[1]},
			Evidence: []string{rec}})
		return true
	}
	if killTimeout.MatchString(rec) {
		p.add("kill", finding.Finding{Detector: finding.DetectorRuntimeWedge, Time: at,
			Attrs:    map[string]string{finding.AttrComponent: "container-runtime", finding.AttrCause: "kill of a container does not complete"},
			Evidence: []string{rec}})
		return true
	}
	if rpcDeadline.MatchString(rec) {
		p.stall("deadline", finding.Finding{Detector: finding.DetectorRuntimeWedge, Time: at,
			Attrs:    map[string]string{finding.AttrComponent: "container-runtime", finding.AttrError: "DeadlineExceeded"},
			Evidence: []string{rec}})
		return true
	}
	if m := fmSwitchErr.FindStringSubmatch(rec); m != nil {
		dev, err := finding.NormalizePCI(m[3])
		if err == nil {
			attrs := map[string]string{finding.AttrSXid: m[2], finding.AttrSeverity: strings.ToLower(m[1]), finding.AttrSource: "fabricmanager"}
			if m[4] != "" {
				attrs[finding.AttrLink] = m[4]
			}
			p.add("fm\x00"+dev+"\x00"+m[2]+"\x00"+m[4], finding.Finding{Detector: finding.DetectorNVSwitchSXid, DevicePCI: dev, Time: at,
				Attrs: attrs, Evidence: []string{rec}})
			return true
		}
	}
	if cudaNotReady.MatchString(rec) {
		p.add("fabric-not-ready", finding.Finding{Detector: finding.DetectorFabricState, Time: at,
			Attrs:    map[string]string{finding.AttrState: "not ready", finding.AttrStatus: "cudaErrorSystemNotReady (802)"},
			Evidence: []string{rec}})
		return true
	}
	if m := versionMismatch.FindStringSubmatch(rec); m != nil {
		src := mismatchSource(rec)
		p.add("vm\x00"+src, finding.Finding{Detector: finding.DetectorDriverVersionMismatch, Time: at,
			Attrs:    map[string]string{finding.AttrError: m[1], finding.AttrSource: src},
			Evidence: []string{rec}})
		return true
	}
	for _, src := range []struct {
		re        *regexp.Regexp
		component string
	}{{dcgmDown, "dcgm"}, {nvmlDown, "nvml"}} {
		if m := src.re.FindStringSubmatch(rec); m != nil {
			e := strings.TrimSpace(m[1])
			p.add("mp\x00"+src.component+"\x00"+e, finding.Finding{Detector: finding.DetectorMonitoring, Time: at,
				Attrs:    map[string]string{finding.AttrComponent: src.component, finding.AttrError: e},
				Evidence: []string{rec}})
			return true
		}
	}
	return false
}

// mismatchSource names the client that hit a driver version mismatch, from
// the line's own words.
func mismatchSource(rec string) string {
	l := strings.ToLower(rec)
	for _, s := range []string{"nvidia-container-cli", "nvidia-container-runtime-hook", "nvidia-container-runtime",
		"nvidia-device-plugin", "dcgm-exporter", "nv-hostengine", "nvidia-persistenced", "nvidia-smi"} {
		if strings.Contains(l, s) {
			return s
		}
	}
	if strings.Contains(l, "device plugin") || strings.Contains(l, "device-plugin") {
		return "nvidia-device-plugin"
	}
	return "nvml"
}

func (p *parser) plegLine(rec string, at time.Time, seen, threshold string) {
	d, err := time.ParseDuration(seen)
	if err != nil {
		return
	}
	if p.plegOpen && !at.IsZero() && !p.plegLast.IsZero() && at.Sub(p.plegLast) > PLEGGap {
		p.closePLEG()
	}
	p.plegLast = at
	if !p.plegOpen {
		p.plegOpen, p.plegMax, p.plegIdx = true, 0, len(p.out)
		p.out = append(p.out, finding.Finding{Detector: finding.DetectorRuntimeWedge, Time: at,
			Attrs: map[string]string{finding.AttrComponent: "kubelet-pleg", finding.AttrThreshold: threshold}})
	}
	f := &p.out[p.plegIdx]
	f.Count++
	if len(f.Evidence) < 16 {
		f.Evidence = append(f.Evidence, rec)
	}
	if d > p.plegMax {
		p.plegMax = d
		f.Attrs[finding.AttrLastSeenActiveMax] = seen
	}
}

func (p *parser) closePLEG() { p.plegOpen = false }

// lineTime reads the line's timestamp: RFC 3339 in a JSON "ts"/"time", or
// syslog / glog time of day, whose missing year kmsg.CompleteYear completes
// against now (the latest year that does not put the line in the future).
func lineTime(rec string, now time.Time) time.Time {
	if strings.HasPrefix(rec, "{") {
		v, _ := jsonlog.Parse(rec)
		if m, ok := v.(map[string]any); ok {
			for _, k := range []string{"ts", "time", "timestamp"} {
				if s, ok := jsonlog.String(m, k); ok {
					if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
						return t.UTC()
					}
				}
			}
		}
		return time.Time{}
	}
	if m := syslogTime.FindStringSubmatch(rec); m != nil {
		if t, err := time.Parse("Jan _2 15:04:05", m[1]); err == nil {
			return kmsg.CompleteYear(t, now)
		}
	}
	if m := glogTime.FindStringSubmatch(rec); m != nil {
		if t, err := time.Parse("0102 15:04:05.999999", m[1]); err == nil {
			return kmsg.CompleteYear(t, now)
		}
	}
	return time.Time{}
}
