// Package textformat recognises the saved text a node's tools produce (the
// kernel log in its renderings, nvidia-smi output, dcgmi diag tables,
// dcgm-exporter samples, JSON logs of GPU health monitors and agents, and the
// kubelet / device plugin / container runtime logs, and a job's own log)
// and routes each to its
// parser, so that `fleetrepair-agent scan` and the case tests read every
// node-side input through one entry point: Scan.
//
// Kubernetes objects and Karpenter events (Node, NodeClaim, conditions,
// "kubectl get events" output) are not node-side data: the controller reads
// them from the API server, and Scan refuses them by name. Saved "kubectl
// describe node" output is read for what a node-side view lacks: GPUs in
// capacity but not allocatable. An input in no format is refused
// (ErrUnrecognized), never read as an empty kernel log.
package textformat

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/detect"
	"github.com/fleetrepair/fleetrepair/agent/detect/dcgmtext"
	"github.com/fleetrepair/fleetrepair/agent/detect/describe"
	"github.com/fleetrepair/fleetrepair/agent/detect/joblog"
	"github.com/fleetrepair/fleetrepair/agent/detect/nvsmi"
	"github.com/fleetrepair/fleetrepair/agent/detect/runtimelog"
	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
)

// Format names an input format. The kernel log renderings are the
// kmsg.Format names ("dmesg", "devkmsg", ...); the others are below.
type Format string

// Non-kernel formats.
const (
	// Auto detects the format from the first SniffBytes of the input.
	Auto Format = "auto"
	// KernelLog is a kernel log whose rendering is detected line by line
	// (kmsg.FormatAuto); the kmsg.Format names pick one rendering.
	KernelLog Format = "kernel"
	// NvidiaSMI is nvidia-smi output: -q sections, "nvlink -s" tables, and
	// its error lines ("Unable to determine the device handle ...").
	NvidiaSMI Format = "nvidia-smi"
	// DcgmiDiag is "dcgmi diag" table output, in dcgmi's layout or collapsed onto one line.
	DcgmiDiag Format = "dcgmi-diag"
	// Prometheus is the Prometheus text format of dcgm-exporter.
	Prometheus Format = "prometheus"
	// JSONLog is a JSON log (one object a line, lines may be wrapped or cut
	// off): health events of GPU health monitors and agents' data-source errors.
	JSONLog Format = "json-log"
	// RuntimeLog is a log of the kubelet, the container runtime or the
	// device plugin, in journald/syslog, glog or bare text form.
	RuntimeLog Format = "runtime-log"
	// JobLog is a workload's own output (a job's or pod's log): NCCL NET/IB
	// errors naming the local NIC and the peer.
	JobLog Format = "job-log"
	// KubectlDescribe is saved "kubectl describe node" output: its
	// Capacity/Allocatable blocks (GPUs the device plugin withholds,
	// agent/detect/describe) and its condition and event messages (as
	// RuntimeLog).
	KubectlDescribe Format = "kubectl-describe"
)

// aliases maps the format names used by the case corpus (expected.yaml
// inputs[].format) to the format that parses them.
var aliases = map[string]Format{
	"nvidia-smi-q": NvidiaSMI, "nvidia-smi-nvlink": NvidiaSMI,
	"dcgmi-diag-table": DcgmiDiag, "dcgmi-diag-collapsed": DcgmiDiag,
	"prometheus-text": Prometheus,
	"journal-syslog":  RuntimeLog, "glog": RuntimeLog, "k8s-event-message": RuntimeLog, "docker-version": RuntimeLog,
	"kubelet": RuntimeLog, "kubectl-describe-node": RuntimeLog, "pod-log": JobLog, "nccl-log": JobLog,
}

// ErrUnknownFormat is returned (wrapped) by ParseFormat.
var ErrUnknownFormat = errors.New("unknown input format")

// Formats lists the format names ParseFormat accepts (aliases excluded),
// Auto first, then the kernel renderings, then the others.
func Formats() []Format {
	out := []Format{Auto, KernelLog}
	for _, f := range kmsg.Formats() {
		if f != kmsg.FormatAuto {
			out = append(out, Format(f))
		}
	}
	return append(out, NvidiaSMI, DcgmiDiag, Prometheus, JSONLog, RuntimeLog, JobLog, KubectlDescribe)
}

// Describe says in one line what each format of Formats reads, for the
// message of an input no format was recognised in.
func Describe() string {
	return "kernel logs (dmesg, dmesg -T, dmesg -H, syslog, journalctl -k, /dev/kmsg records), " +
		"nvidia-smi output, dcgmi diag tables, dcgm-exporter (Prometheus) samples, JSON health/agent logs, " +
		"kubelet / container runtime / device plugin logs, job logs (NCCL), kubectl describe node (Capacity/Allocatable)"
}

// ParseFormat returns the Format named s: a name of Formats, "kmsg" (an
// alias of "devkmsg"), or a format name of the case corpus (aliases).
func ParseFormat(s string) (Format, error) {
	switch s {
	case "kmsg":
		return Format(kmsg.FormatDevKmsg), nil
	}
	if f, ok := aliases[s]; ok {
		return f, nil
	}
	for _, f := range Formats() {
		if string(f) == s {
			return f, nil
		}
	}
	names := make([]string, 0, 16)
	for _, f := range Formats() {
		names = append(names, string(f))
	}
	return "", fmt.Errorf("parse format %q (want one of %s): %w", s, strings.Join(names, ", "), ErrUnknownFormat)
}

// Kernel returns the kmsg format of f and true when f is a kernel log
// rendering (KernelLog as kmsg.FormatAuto).
func (f Format) Kernel() (kmsg.Format, bool) {
	switch f {
	case KernelLog:
		return kmsg.FormatAuto, true
	case Auto, NvidiaSMI, DcgmiDiag, Prometheus, JSONLog, RuntimeLog, JobLog, KubectlDescribe, Unrecognized:
		return "", false
	}
	k, err := kmsg.ParseFormat(string(f))
	return k, err == nil
}

// SniffBytes is how much of the input Sniff looks at.
const SniffBytes = 64 * 1024

var (
	sniffDiag = regexp.MustCompile(`\|\s*Diagnostic\s*\|\s*Result\s*\||dcgmi diag`)
	sniffProm = regexp.MustCompile(`(?m)^(# (HELP|TYPE) \S+|DCGM_[A-Z0-9_]+(\{|\s))`)
	sniffSMI  = regexp.MustCompile(`(?im)Unable to determine the device handle|all links are inactive|^\s*Remapped Rows\s*$|^\s*Link \d+: (<inactive>|[0-9.]+ GB/s)|NVIDIA-SMI \d+\.\d+|^\s*(?:\$ )?nvidia-smi|^==============NVSMI LOG|^Failed to initialize NVML|^NVML library version|^No devices were found`)
	// sniffKernel matches a line that is a kernel log record in one of its
	// renderings: dmesg "[  12.345678] ..." (and -T / relative forms in
	// brackets), /dev/kmsg "6,1234,5678,-;...", syslog or journalctl lines
	// tagged kernel: (classic, ISO and journalctl's "[Tue 2024-03-05 ...]"
	// time forms), and bare driver messages copied without their prefix
	// ("NVRM: Xid ...", "nvidia-nvswitch3: SXid ...").
	sniffKernel = regexp.MustCompile(`^(?:\s*NVRM: |\s*nvidia-nvswitch\d*: |\[\s*\d+\.\d+\]|\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d \d{4}\]|\d+,\d+,\d+,[^;]*;|(?:[A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT\S+|\[[A-Z][a-z]{2} \d{4}-\d\d-\d\d [^\]]+\]) \S+ kernel: )`)
	sniffJob    = regexp.MustCompile(`(?m)^(?:\[[^\]]*\]\s*)?[\w.-]+:\d+:\d+ \[\d+\] .*NCCL (?:WARN|INFO)`)
	sniffRT     = regexp.MustCompile(`(?m)^[A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d \S+ (kubelet|containerd|dockerd|crio|nvidia-device-plugin|nvidia-container)[^:\s]*:|^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\]|^Server: Docker Engine|device plugin \w+ rpc failed|OCI runtime create failed|^nvidia-container-cli: |KubeletNotReady|NodeStatusUnknown|status is now: NodeNotReady|rpc error: code = \w+ desc =|detected NVSwitch (?:non-)?fatal error|\[(?:ERROR|WARNING|INFO)\] \[tid \d+\]|CUDA error: system not yet initialized|^\s*Type\s+Status\s+LastHeartbeatTime\s+LastTransitionTime`)
)

// Unrecognized is what Sniff returns for an input with no sign of any
// format; Scan refuses it (ErrUnrecognized) instead of reading it as a
// kernel log and reporting "0 findings", which reads as healthy.
const Unrecognized Format = "unrecognized"

var (
	// sniffDescribe: the Capacity and Allocatable blocks of kubectl describe node.
	sniffDescribe = regexp.MustCompile(`(?m)^Capacity:\s*$[\s\S]*^Allocatable:\s*$`)
	// sniffObject: a Kubernetes object in YAML or JSON (Node, NodeClaim, Event).
	sniffObject = regexp.MustCompile(`(?m)^(?:apiVersion: \S+|kind: [A-Z]\w+|\s*"apiVersion": ")`)
	// kindRE names the object's kind for the message.
	kindRE = regexp.MustCompile(`(?m)^kind: ([A-Z]\w+)|"kind": "([A-Z]\w+)"`)
)

// Sniff guesses the format of an input from its beginning. It returns a
// format only on a sign of it (a JSON object, the dcgmi table header, a job
// log's NCCL lines, mostly kernel log records, nvidia-smi's own texts,
// Prometheus comments or DCGM_ samples, kubelet/runtime/glog line
// prefixes, the Capacity/Allocatable blocks of kubectl describe node),
// KernelLog for an empty input, and Unrecognized otherwise. An input whose lines are mostly kernel log
// records is a kernel log whatever words its messages carry: a kernel log
// naming the nvidia-smi process (an Xid's "name=nvidia-smi", a hung
// nvidia-smi) must never be read as nvidia-smi output and lose its Xids.
func Sniff(head []byte) Format {
	t := bytes.TrimSpace(head)
	switch {
	case len(t) == 0:
		return KernelLog // an empty input: nothing to recognise, nothing found
	case bytes.HasPrefix(t, []byte("{")):
		return JSONLog
	case sniffDiag.Match(t):
		return DcgmiDiag
	case sniffJob.Match(t):
		return JobLog
	case mostlyKernel(t):
		return KernelLog
	case sniffSMI.Match(t):
		return NvidiaSMI
	case sniffProm.Match(t):
		return Prometheus
	case sniffDescribe.Match(t):
		return KubectlDescribe
	case sniffRT.Match(t):
		return RuntimeLog
	case anyKernel(t):
		// Some kernel records among other text (a paste with a shell
		// prompt, a ticket): still a kernel log, examined line by line.
		return KernelLog
	}
	return Unrecognized
}

// anyKernel reports whether some line of t is a kernel log record: one the
// kernel log parser itself reads in one of its renderings (kmsg.ParseText),
// or a bare driver message (sniffKernel).
func anyKernel(t []byte) bool {
	p := kmsg.NewTextParser(bytes.NewReader(t), kmsg.FormatAuto, kmsg.TextOptions{})
	for {
		rec, ok := p.Next()
		if !ok {
			break
		}
		if !rec.Unparsed || sniffKernel.MatchString(rec.Raw) {
			return true
		}
	}
	return false
}

// ErrUnrecognized is returned (wrapped) by Scan with Auto for an input in
// no format it reads; the message lists them (Describe).
var ErrUnrecognized = errors.New("no known input format recognised")

// unrecognized explains why head is in no format, naming a Kubernetes
// object's kind (the controller reads those from the API server).
func unrecognized(head []byte) error {
	t := bytes.TrimSpace(head)
	if sniffObject.Match(t) {
		kind := "a Kubernetes object"
		if m := kindRE.FindSubmatch(t); m != nil {
			kind = "a Kubernetes " + string(m[1]) + string(m[2])
		}
		return fmt.Errorf("scan: the input is %s (YAML/JSON): the controller reads Nodes, NodeClaims and events from the API server, scan does not; scan reads %s: %w", kind, Describe(), ErrUnrecognized)
	}
	return fmt.Errorf("scan: the input is in no format scan reads (%s); name one with --format (--format kernel examines any text as kernel log lines): %w", Describe(), ErrUnrecognized)
}

// mostlyKernel reports whether at least half of the non-empty lines of t
// (and at least one) are kernel log records (sniffKernel). The last line of
// a sniffed head may be cut short; it counts like the others.
func mostlyKernel(t []byte) bool {
	kernel, lines := 0, 0
	for len(t) > 0 {
		var line []byte
		line, t, _ = bytes.Cut(t, []byte("\n"))
		line = bytes.TrimRight(line, "\r")
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		lines++
		if sniffKernel.Match(line) {
			kernel++
		}
	}
	return kernel > 0 && 2*kernel >= lines
}

// ErrNotText is returned by Scan for an input that is no text log at all
// (compressed, binary): reading it as a kernel log would say "0 findings",
// which an SRE would read as healthy.
var ErrNotText = errors.New("not a text log")

// Options configure Scan.
type Options struct {
	// Node and BootID are put into every finding.
	Node, BootID string
	// Rules replaces the embedded kernel-log rules.
	Rules *detect.Rules
	// Events returns one kernel finding per event instead of the per-input
	// aggregate (detect.Aggregate). Other formats are grouped by their parser.
	Events bool
	// BootTime, when set, places kernel records that carry only a time since
	// boot (dmesg "[7510.129324]", /dev/kmsg) in wall-clock time: BootTime
	// plus their monotonic timestamp. Records with a wall-clock time of their
	// own keep it. Without BootTime, the boot time is read from the input
	// when it holds one (SniffBootTime: a btime, "uptime -s" or "who -b"
	// line, or a record with both times); else such records stay untimed
	// (zero Time, counted in Result.Untimed).
	BootTime time.Time
}

// Result is what Scan read.
type Result struct {
	// Format is the format the input was read as (after Auto detection).
	Format Format
	// Findings are complete (node, boot ID, ID) and in input order.
	Findings []finding.Finding
	// Lines is the number of lines (or records) read.
	Lines int
	// Kernel holds the kernel parser's and detector's counters for a kernel
	// log input; nil otherwise.
	Kernel *KernelStats
	// BootTime is the wall-clock time of the input's boot that placed its
	// records with a time since boot only, and BootTimeSource where it came
	// from (BootTime* constants); zero and "" when it is unknown.
	BootTime       time.Time
	BootTimeSource string
	// Untimed counts the findings without a time (Finding.Time zero): their
	// records carried a time since boot only and the boot time is unknown
	// (give it with Options.BootTime), or none at all.
	Untimed int
}

// KernelStats are the counters of a kernel log scan.
type KernelStats struct {
	Text   kmsg.TextStats
	Detect detect.Stats
}

// Scan reads one input in format f (Auto: see Sniff) and returns its
// findings. Errors: reading the input, and ctx ending during a kernel log.
func Scan(ctx context.Context, r io.Reader, f Format, o Options) (Result, error) {
	br := bufio.NewReaderSize(r, SniffBytes)
	head, _ := br.Peek(SniffBytes)
	if bytes.HasPrefix(head, []byte{0x1f, 0x8b}) {
		return Result{}, fmt.Errorf("scan: the input is gzip-compressed: decompress it first (zcat FILE | fleetrepair-agent scan -): %w", ErrNotText)
	}
	if bytes.IndexByte(head, 0) >= 0 {
		return Result{}, fmt.Errorf("scan: the input holds NUL bytes, it is not a text log: %w", ErrNotText)
	}
	if f == Auto || f == "" {
		f = Sniff(head)
		if f == Unrecognized {
			return Result{Format: Unrecognized}, unrecognized(head)
		}
	}
	res := Result{Format: f}
	if k, ok := f.Kernel(); ok {
		res.BootTime, res.BootTimeSource = o.BootTime, BootTimeFlag
		if o.BootTime.IsZero() {
			res.BootTime, res.BootTimeSource = SniffBootTime(head)
		}
		res, err := scanKernel(ctx, br, k, o, res)
		res.Untimed = untimed(res.Findings)
		return res, err
	}
	var (
		fs  []finding.Finding
		err error
	)
	switch f {
	case NvidiaSMI:
		var st nvsmi.Stats
		fs, st, err = nvsmi.Parse(br)
		res.Lines = st.Lines
	case DcgmiDiag:
		fs, err = dcgmtext.ParseDiag(br)
	case Prometheus:
		fs, err = dcgmtext.ParseMetrics(br)
	case JobLog:
		var st joblog.Stats
		fs, st, err = joblog.Parse(br)
		res.Lines = st.Lines
	case RuntimeLog:
		var st runtimelog.Stats
		fs, st, err = runtimelog.Parse(br)
		res.Lines = st.Lines
	case KubectlDescribe:
		// One read, two parsers: Capacity/Allocatable, and the condition
		// and event messages.
		data, rerr := io.ReadAll(io.LimitReader(br, 64<<20))
		if rerr != nil {
			return res, fmt.Errorf("scan kubectl describe: %w", rerr)
		}
		var dst describe.Stats
		fs, dst, err = describe.Parse(bytes.NewReader(data))
		if err == nil {
			var more []finding.Finding
			more, _, err = runtimelog.Parse(bytes.NewReader(data))
			fs = append(fs, more...)
		}
		res.Lines = dst.Lines
	case JSONLog:
		// One read, two parsers: health events, and the runtime rules
		// (an agent's own data source failing).
		data, rerr := io.ReadAll(io.LimitReader(br, 64<<20))
		if rerr != nil {
			return res, fmt.Errorf("scan json log: %w", rerr)
		}
		fs, err = dcgmtext.ParseHealthEvents(bytes.NewReader(data))
		if err == nil {
			var more []finding.Finding
			var st runtimelog.Stats
			more, st, err = runtimelog.Parse(bytes.NewReader(data))
			fs = append(fs, more...)
			res.Lines = st.Lines
		}
	default:
		return res, fmt.Errorf("scan: format %q: %w", f, ErrUnknownFormat)
	}
	if err != nil {
		return res, fmt.Errorf("scan %s: %w", f, err)
	}
	for _, x := range fs {
		res.Findings = append(res.Findings, detect.Stamp(x, o.Node, o.BootID))
	}
	res.Untimed = untimed(res.Findings)
	return res, nil
}

// untimed counts the findings without a time.
func untimed(fs []finding.Finding) int {
	n := 0
	for _, f := range fs {
		if f.Time.IsZero() {
			n++
		}
	}
	return n
}

func scanKernel(ctx context.Context, r io.Reader, format kmsg.Format, o Options, res Result) (Result, error) {
	p := kmsg.NewTextParser(r, format, kmsg.TextOptions{})
	d := detect.New(detect.Options{Node: o.Node, BootID: o.BootID, Rules: o.Rules})
	var events []finding.Finding
	for n := 0; ; n++ {
		if n%4096 == 0 && ctx.Err() != nil {
			return res, fmt.Errorf("scan kernel log: %w", ctx.Err())
		}
		rec, ok := p.Next()
		if !ok {
			break
		}
		if rec.Time.IsZero() && rec.Usec >= 0 && !res.BootTime.IsZero() {
			rec.Time = res.BootTime.Add(time.Duration(rec.Usec) * time.Microsecond).UTC()
		}
		events = append(events, d.Feed(rec)...)
	}
	if err := p.Err(); err != nil {
		return res, fmt.Errorf("scan kernel log: %w", err)
	}
	events = append(events, d.Flush()...)
	if !o.Events {
		events = detect.Aggregate(events)
	}
	st := p.Stats()
	res.Findings, res.Lines = events, int(st.Lines)
	res.Kernel = &KernelStats{Text: st, Detect: d.Stats()}
	return res, nil
}
