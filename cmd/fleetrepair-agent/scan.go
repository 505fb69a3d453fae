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

	"github.com/spf13/cobra"

	"github.com/fleetrepair/fleetrepair/agent/detect"
	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
)

// scanOptions are the flags of "scan".
type scanOptions struct {
	format string // kmsg.Format name
	node   string // Finding.Node
	bootID string // Finding.BootID
	rules  string // rules file replacing the embedded rules
	events bool   // print one finding per event instead of the per-file aggregate
}

func newScanCmd(s streams) *cobra.Command {
	o := scanOptions{format: string(kmsg.FormatAuto), node: os.Getenv("NODE_NAME")}
	formats := make([]string, 0, 8)
	for _, f := range kmsg.Formats() {
		formats = append(formats, string(f))
	}
	cmd := &cobra.Command{
		Use:   "scan [flags] FILE...",
		Short: "Read kernel log files and print findings as JSON lines",
		Long: `scan reads saved kernel logs (dmesg, dmesg --ctime, dmesg -H, syslog,
journalctl -k or /dev/kmsg records; FILE "-" is standard input), runs the
agent's detectors on them and prints the findings, one finding.Finding JSON
object per line, on standard output.

Each FILE is scanned on its own. By default the findings of a file are
aggregated: the same fact on the same device becomes one finding with a count
(see detect.Aggregate); --events prints every event as the live agent would
send it. Lines that fit no format are still examined, and counted on standard
error. Exit status: 0 when every file was read (with or without findings),
1 when a file cannot be read, 2 for bad flags.`,
		Example: `  fleetrepair-agent scan --format dmesg node-a1.dmesg.txt
  journalctl -k -b | fleetrepair-agent scan --node node-a1 -`,
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
	fl.StringVar(&o.format, "format", o.format, "input format: "+strings.Join(formats, "|")+" (kmsg = devkmsg)")
	fl.StringVar(&o.node, "node", o.node, "node name put into every finding (env NODE_NAME)")
	fl.StringVar(&o.bootID, "boot-id", "", "boot ID put into every finding (the input's boot, if known)")
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
	format, err := kmsg.ParseFormat(o.format)
	if err != nil {
		return usageError{fmt.Errorf("scan: --format: %w", err)}
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
	for _, in := range inputs {
		fs, stats, dstats, err := o.scanOne(ctx, in, format, rules)
		if err != nil {
			return err
		}
		for _, f := range fs {
			if err := enc.Encode(f); err != nil {
				return fmt.Errorf("scan: write findings: %w", err)
			}
		}
		fmt.Fprintf(s.err, "scan %s: %d lines, %d records, %d unparsed lines (examined as raw text), %d findings (%d events)\n",
			in.name, stats.Lines, stats.Records, stats.Unparsed, len(fs), sum(dstats.Findings))
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("scan: write findings: %w", err)
	}
	return nil
}

// scanOne scans one input with a Detector of its own.
func (o scanOptions) scanOne(ctx context.Context, in scanInput, format kmsg.Format, rules *detect.Rules) ([]finding.Finding, kmsg.TextStats, detect.Stats, error) {
	p := kmsg.NewTextParser(in.r, format, kmsg.TextOptions{})
	d := detect.New(detect.Options{Node: o.node, BootID: o.bootID, Rules: rules})
	var events []finding.Finding
	for n := 0; ; n++ {
		if n%4096 == 0 && ctx.Err() != nil {
			return nil, kmsg.TextStats{}, detect.Stats{}, fmt.Errorf("scan %s: %w", in.name, ctx.Err())
		}
		rec, ok := p.Next()
		if !ok {
			break
		}
		events = append(events, d.Feed(rec)...)
	}
	if err := p.Err(); err != nil {
		return nil, kmsg.TextStats{}, detect.Stats{}, fmt.Errorf("scan %s: %w", in.name, err)
	}
	events = append(events, d.Flush()...)
	if !o.events {
		events = detect.Aggregate(events)
	}
	return events, p.Stats(), d.Stats(), nil
}

func sum(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}
