package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetrepair/fleetrepair/agent/detect"
	"github.com/fleetrepair/fleetrepair/agent/detect/textformat"
)

// scanOptions are the flags of "scan".
type scanOptions struct {
	format string // textformat.Format name
	node   string // Finding.Node
	bootID string // Finding.BootID
	// bootTime is when the input's boot started (RFC 3339), "" unknown.
	bootTime string
	rules    string // rules file replacing the embedded rules
	events   bool   // print one finding per event instead of the per-file aggregate
}

func newScanCmd(s streams) *cobra.Command {
	o := scanOptions{format: string(textformat.Auto), node: os.Getenv("NODE_NAME")}
	formats := make([]string, 0, 16)
	for _, f := range textformat.Formats() {
		formats = append(formats, string(f))
	}
	cmd := &cobra.Command{
		Use:   "scan [flags] FILE...",
		Short: "Read saved kernel logs and tool outputs, print findings as JSON lines",
		Long: `scan reads saved node-side inputs (FILE "-" is standard input), runs the
agent's detectors on them and prints the findings, one finding.Finding JSON
object per line, on standard output. Inputs:

  kernel logs     dmesg, dmesg --ctime, dmesg -H, syslog, journalctl -k, /dev/kmsg records
  nvidia-smi      -q sections (Remapped Rows, Retired Pages), nvlink -s, its error lines
  dcgmi-diag      "dcgmi diag" tables, also collapsed onto one line
  prometheus      dcgm-exporter samples (Xid gauges)
  json-log        GPU health monitor events, agents' DCGM/NVML connection errors
  runtime-log     kubelet (PLEG, kill timeouts), device plugin, pod admission errors
  job-log         a job's or pod's own log: NCCL NET/IB errors naming NIC and peer
  kubectl-describe  "kubectl describe node": GPUs in Capacity but not Allocatable
                  (device-plugin finding, withheld_gpus), condition/event messages

With --format auto (the default) the format of each FILE is detected from
its beginning; name it with --format where detection guesses wrong. A FILE
in none of these formats (an apt history log, a Node or NodeClaim YAML) is
not scanned: standard error says so, naming the formats, the other FILEs are
still scanned, and the exit status is 1. Kubernetes objects (Node,
NodeClaim, events) are read by the controller from the API server, not
here. With an explicit kernel --format, a FILE none of whose lines is a
kernel record is scanned (its lines examined as raw text) with a warning.

Times: dmesg and /dev/kmsg records carry only a time since boot. They are
placed in wall-clock time with --boot-time, else with a boot time the input
holds (a "btime" line of /proc/stat, an "uptime -s" or "who -b" line saved
with the log, or a syslog/journal line that carries both times); without one
their findings stay untimed (no "time" field), and standard error says how
many.

Each FILE is scanned on its own. By default the kernel findings of a file are
aggregated: the same fact on the same device becomes one finding with a count
(see detect.Aggregate); --events prints every kernel event as the live agent
would send it. Kernel lines that fit no rendering are still examined, and
counted on standard error; driver lines with a number out of range (an Xid
beyond 99999) are rejected, counted and named there. Exit status: 0 when
every file was read (with or without findings), 1 when a file cannot be
read or is in no format scan reads, 2 for bad flags.`,
		Example: `  fleetrepair-agent scan --format dmesg node-a1.dmesg.txt
  journalctl -k -b | fleetrepair-agent scan --node node-a1 -
  nvidia-smi -q | fleetrepair-agent scan -
  fleetrepair-agent scan dcgmi-diag.txt kubelet.log`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError{errors.New("scan: at least one FILE (or - for standard input) is required")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context(), args, s)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.format, "format", o.format, "input format: "+strings.Join(formats, "|")+" (kmsg = devkmsg; kernel = any kernel rendering)")
	fl.StringVar(&o.node, "node", o.node, "node name put into every finding (env NODE_NAME)")
	fl.StringVar(&o.bootID, "boot-id", "", "boot ID put into every finding (the input's boot, if known)")
	fl.StringVar(&o.bootTime, "boot-time", "", "when the input's boot started (RFC 3339): places dmesg and /dev/kmsg timestamps in wall-clock time; without it they stay untimed")
	fl.StringVar(&o.rules, "rules", "", "rules file replacing the embedded kernel-log rules")
	fl.BoolVar(&o.events, "events", false, "print one finding per event instead of aggregating per file")
	return cmd
}

// scanInput is one FILE argument, opened.
type scanInput struct {
	name string
	r    io.Reader
	c    io.Closer // nil for standard input
}

func (o scanOptions) run(ctx context.Context, args []string, s streams) error {
	format, err := textformat.ParseFormat(o.format)
	if err != nil {
		return usageError{fmt.Errorf("scan: --format: %w", err)}
	}
	var boot time.Time
	if o.bootTime != "" {
		if boot, err = time.Parse(time.RFC3339Nano, o.bootTime); err != nil {
			return usageError{fmt.Errorf("scan: --boot-time %q is not RFC 3339 (2026-02-02T20:47:01Z): %w", o.bootTime, err)}
		}
	}
	rules := detect.DefaultRules()
	if o.rules != "" {
		if rules, err = detect.LoadRules(o.rules); err != nil {
			return fmt.Errorf("scan: %w", err)
		}
	}
	// Open every file first, so that a typo fails before anything is printed.
	inputs := make([]scanInput, 0, len(args))
	defer func() {
		for _, in := range inputs {
			if in.c != nil {
				in.c.Close()
			}
		}
	}()
	stdin := false
	for _, name := range args {
		if name == "-" {
			if stdin {
				return usageError{errors.New("scan: standard input (-) given twice")}
			}
			stdin = true
			inputs = append(inputs, scanInput{name: "-", r: s.in})
			continue
		}
		f, err := os.Open(name)
		if err != nil {
			return fmt.Errorf("scan: open input: %w", err)
		}
		inputs = append(inputs, scanInput{name: name, r: f, c: f})
	}

	w := bufio.NewWriter(s.out)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	var unknown []string
	for _, in := range inputs {
		res, err := textformat.Scan(ctx, in.r, format, textformat.Options{Node: o.node, BootID: o.bootID, Rules: rules, Events: o.events, BootTime: boot})
		if errors.Is(err, textformat.ErrUnrecognized) {
			// Said plainly, and the other files are still scanned; the
			// exit status is 1 at the end.
			fmt.Fprintf(s.err, "scan %s: NOT SCANNED: %v\n", in.name, err)
			unknown = append(unknown, in.name)
			continue
		}
		if err != nil {
			return fmt.Errorf("scan %s: %w", in.name, err)
		}
		for _, f := range res.Findings {
			if err := enc.Encode(f); err != nil {
				return fmt.Errorf("scan: write findings: %w", err)
			}
		}
		if k := res.Kernel; k != nil {
			fmt.Fprintf(s.err, "scan %s: kernel log (%s), %d lines, %d records, %d unparsed lines (examined as raw text), %d findings (%d events)%s\n",
				in.name, res.Format, k.Text.Lines, k.Text.Records, k.Text.Unparsed, len(res.Findings), sum(k.Detect.Findings), timing(res))
			if k.Text.Lines > 0 && k.Text.Records == k.Text.Unparsed {
				fmt.Fprintf(s.err, "scan %s: warning: none of its %d lines is a kernel log record in a rendering scan knows (%s); 0 findings says nothing about the node\n",
					in.name, k.Text.Lines, formatNames())
			}
			if k.Detect.Rejected > 0 {
				fmt.Fprintf(s.err, "scan %s: %d driver lines rejected (a number out of range; no finding made), last: %s\n",
					in.name, k.Detect.Rejected, k.Detect.LastRejected)
			}
		} else {
			fmt.Fprintf(s.err, "scan %s: %s, %d lines, %d findings%s\n", in.name, res.Format, res.Lines, len(res.Findings), timing(res))
		}
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("scan: write findings: %w", err)
	}
	if len(unknown) > 0 {
		return fmt.Errorf("scan: %d of %d inputs in no format scan reads (%s): %w", len(unknown), len(inputs), strings.Join(unknown, ", "), textformat.ErrUnrecognized)
	}
	return nil
}

// timing says how the findings of one input were placed in time: the boot
// time used and its source, and how many findings stayed untimed.
func timing(res textformat.Result) string {
	out := ""
	if !res.BootTime.IsZero() {
		out = fmt.Sprintf(", boot time %s (from %s)", res.BootTime.Format(time.RFC3339), res.BootTimeSource)
	}
	if res.Untimed > 0 {
		out += fmt.Sprintf(", %d untimed findings (no time in the input: give --boot-time, or save btime / uptime -s with the log)", res.Untimed)
	}
	return out
}

func sum(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}
