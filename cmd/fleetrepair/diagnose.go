package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/policy"
)

func newDiagnoseCmd() *cobra.Command {
	var node, boot, instanceType, policyFile, nowFlag string
	cmd := &cobra.Command{
		Use:   "diagnose [FILE|-]",
		Short: "Print the diagnoses the controller's rules reach for findings (JSON lines in, JSON lines out)",
		Long: `Read findings as JSON lines (the output of "fleetrepair-agent scan") from FILE or
stdin and print, as JSON lines, the diagnoses the controller's rules reach for
each node, most consequential first. No database or cluster is needed.

  fleetrepair-agent scan dmesg.txt | fleetrepair diagnose -`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in := cmd.InOrStdin()
			if len(args) == 1 && args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return fmt.Errorf("open findings: %w", err)
				}
				defer f.Close()
				in = f
			}
			opts := diagnose.Options{}
			if policyFile != "" {
				pol, err := policy.Load(policyFile, catalog.Default())
				if err != nil {
					return err
				}
				opts.InstanceTypes = pol.InstanceTypeOverrides()
			}
			eng, err := diagnose.New(opts)
			if err != nil {
				return err
			}
			if _, known := eng.InstanceType(instanceType); instanceType != "" && !known {
				return fmt.Errorf("unknown instance type %q: add it under instanceTypes in a --policy file", instanceType)
			}
			now := time.Now()
			if nowFlag != "" {
				if now, err = time.Parse(time.RFC3339, nowFlag); err != nil {
					return fmt.Errorf("--now %q: want an RFC 3339 time, e.g. 2026-11-30T13:00:00Z", nowFlag)
				}
			}
			return diagnoseStream(eng, in, cmd.OutOrStdout(), node, boot, instanceType, now)
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "node name for findings that carry none")
	cmd.Flags().StringVar(&boot, "boot-id", "", "current boot ID (findings of other boots count as history); empty: all current")
	cmd.Flags().StringVar(&instanceType, "instance-type", "", "the node's instance type (e.g. p5.48xlarge, g5.xlarge): its GPU count and NVLink wiring decide gpu-count and NVLink findings; empty: unknown")
	cmd.Flags().StringVar(&nowFlag, "now", "", "diagnose as of this RFC 3339 time instead of the wall clock: a saved snapshot (kubectl describe node) is judged when it was taken, so its conditions' heartbeats are not stale")
	cmd.Flags().StringVar(&policyFile, "policy", "", "policy file whose instanceTypes extend the built-in table (docs/policy.md)")
	return cmd
}

// diagnoseStream decodes findings (a stream of JSON objects, one per line
// as scan prints them), groups them by node and writes each node's
// diagnoses. A malformed or invalid finding is an error naming its position.
func diagnoseStream(eng *diagnose.Engine, in io.Reader, out io.Writer, defaultNode, boot, instanceType string, now time.Time) error {
	byNode := map[string][]finding.Finding{}
	dec := json.NewDecoder(in)
	dec.DisallowUnknownFields()
	for n := 1; ; n++ {
		var f finding.Finding
		err := dec.Decode(&f)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("decode finding %d: %w (input must be findings as JSON lines, the output of fleetrepair-agent scan)", n, err)
		}
		if f.Node == "" {
			f.Node = defaultNode
		}
		if f.Count == 0 {
			f.Count = 1
		}
		if f.ID == "" {
			f.ID = finding.NewID(f)
		}
		node := f.Node
		if node == "" {
			node = "unnamed-node"
		}
		r := finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "local", Node: node, BootID: "-", Findings: []finding.Finding{f}}
		r.Findings[0].Node = node
		if err := r.Validate(); err != nil {
			return fmt.Errorf("finding %d: %w", n, err)
		}
		byNode[f.Node] = append(byNode[f.Node], f)
	}
	nodes := make([]string, 0, len(byNode))
	for n := range byNode {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	enc := json.NewEncoder(out)
	for _, n := range nodes {
		for _, d := range eng.Diagnose(diagnose.Input{Node: n, BootID: boot, Findings: byNode[n], Now: now, InstanceType: instanceType}) {
			if err := enc.Encode(d); err != nil {
				return fmt.Errorf("write diagnosis: %w", err)
			}
		}
	}
	return nil
}
