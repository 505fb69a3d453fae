package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetrepair/fleetrepair/controller/config"
	"github.com/fleetrepair/fleetrepair/controller/simulate"
)

// simulateOptions are the flags of the simulate command.
type simulateOptions struct {
	json, table, strict bool
	cases               string // a case corpus directory
	policies            []string
	config              string // the controller configuration file (docs/config.md)
}

func newSimulateCmd() *cobra.Command {
	var o simulateOptions
	cmd := &cobra.Command{
		Use:   "simulate [SCENARIO.yaml ...]",
		Short: "Replay fleet scenarios through the real diagnosis and breaker code and two baselines",
		Long: `Replay each scenario (docs/simulator.md) on a simulated clock through
fleetrepair's diagnosis rules, cohort breakers and repair policy, and through
two baselines: Karpenter's NodeRepair rule (no repair above 20% unhealthy per
NodePool) and NVSentinel's (pause above 50% of GPU nodes unhealthy within 5
minutes). Print trips, deletions, paused repairs, the checkpoints' results
and, per policy, healthy-cause nodes deleted, broken nodes left unrepaired
and the time to repair lone failures. No database or cluster is needed.

A scenario.yaml next to an expected.yaml (a case of the corpus) is also
checked against the case's breaker outcome.

  fleetrepair simulate test/fixtures/cases/c10-xid31-driver-rollout/scenario.yaml
  fleetrepair simulate --json controller/simulate/testdata/zone-outage.yaml
  fleetrepair simulate --cases test/fixtures/cases --table controller/simulate/testdata/*.yaml
  fleetrepair simulate --config deploy/config.example.yaml controller/simulate/testdata/zone-outage.yaml`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 && o.cases == "" {
				return errors.New("simulate: name at least one scenario file, or --cases DIR")
			}
			return runSimulate(cmd.Context(), cmd.OutOrStdout(), args, o)
		},
	}
	cmd.Flags().BoolVar(&o.json, "json", false, "print the results as JSON (an object for one scenario, an array for several)")
	cmd.Flags().BoolVar(&o.table, "table", false, "print the comparison table of docs/breakers.md (Markdown)")
	cmd.Flags().StringVar(&o.cases, "cases", "", "also run every DIR/*/scenario.yaml of a case corpus (the repository's is test/fixtures/cases)")
	cmd.Flags().BoolVar(&o.strict, "strict", false, "exit with status 1 when a checkpoint or expectation fails or cannot be evaluated")
	cmd.Flags().StringSliceVar(&o.policies, "policy", nil, "policies to replay (fleetrepair, karpenter, nvsentinel; default all)")
	cmd.Flags().StringVar(&o.config, "config", envOr("FLEETREPAIR_CONFIG", ""), "replay fleetrepair with this controller configuration, the file the controller runs with (docs/config.md; env FLEETREPAIR_CONFIG); a scenario's parameters override it")
	return cmd
}

// runSimulate loads and replays the scenarios and writes the results.
func runSimulate(ctx context.Context, out io.Writer, files []string, o simulateOptions) error {
	cfg := config.Default()
	if o.config != "" {
		var err error
		if cfg, err = config.Load(o.config, nil); err != nil {
			return err
		}
	}
	var scenarios []*simulate.Scenario
	if o.cases != "" {
		corpus := os.DirFS(o.cases)
		paths, err := fs.Glob(corpus, "*/scenario.yaml")
		if err != nil {
			return fmt.Errorf("list case scenarios in %s: %w", o.cases, err)
		}
		if len(paths) == 0 {
			return fmt.Errorf("simulate --cases %s: no */scenario.yaml there", o.cases)
		}
		for _, p := range paths {
			sc, err := simulate.LoadFS(corpus, p)
			if err != nil {
				return fmt.Errorf("load %s: %w", p, err)
			}
			scenarios = append(scenarios, sc)
		}
	}
	for _, f := range files {
		sc, err := simulate.LoadFile(f)
		if err != nil {
			return fmt.Errorf("load %s: %w", f, err)
		}
		scenarios = append(scenarios, sc)
	}
	var results []*simulate.Result
	failed := 0
	for _, sc := range scenarios {
		res, err := simulate.Run(sc, simulate.Options{Policies: o.policies, Context: ctx, Config: &cfg})
		if err != nil {
			return err
		}
		if !res.Pass {
			failed++
		}
		results = append(results, res)
	}
	var err error
	switch {
	case o.table:
		err = simulate.WriteTable(out, results)
	case o.json:
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		var v any = results
		if len(results) == 1 {
			v = results[0]
		}
		if e := enc.Encode(v); e != nil {
			err = fmt.Errorf("write results: %w", e)
		}
	default:
		err = writeSimulateText(out, results)
	}
	if err != nil {
		return err
	}
	if o.strict && failed > 0 {
		return fmt.Errorf("simulate: %d of %d scenarios failed their checks", failed, len(results))
	}
	return nil
}

// seconds prints a number of seconds as a duration, "-" for none.
func seconds(s float64) string {
	if s == 0 {
		return "-"
	}
	return (time.Duration(s) * time.Second).String()
}

// writeSimulateText writes a human summary of each result.
func writeSimulateText(out io.Writer, results []*simulate.Result) error {
	var b strings.Builder
	for i, r := range results {
		if i > 0 {
			b.WriteString("\n")
		}
		verdict := "PASS"
		if !r.Pass {
			verdict = "FAIL"
		}
		checks := append(append([]simulate.Check(nil), r.Checkpoints...), r.Expectations...)
		n := map[string]int{}
		for _, c := range checks {
			n[c.Status]++
		}
		fmt.Fprintf(&b, "%s: %s (%d nodes, %s; checks: %d passed, %d failed, %d not evaluated)\n", r.Scenario, verdict,
			r.Nodes, r.Duration, n[simulate.StatusPass], n[simulate.StatusFail], n[simulate.StatusUnevaluated])
		for _, c := range checks {
			if c.Status != simulate.StatusPass {
				at := c.At
				if at == "" {
					at = "end"
				}
				fmt.Fprintf(&b, "  %s %s %s: want %v, got %v", strings.ToUpper(c.Status), at, c.Key, c.Want, c.Got)
				if c.Detail != "" {
					fmt.Fprintf(&b, " (%s)", c.Detail)
				}
				b.WriteString("\n")
			}
		}
		if len(r.Halted) > 0 {
			fmt.Fprintf(&b, "  rollout halted: %d change steps skipped (first at %s, breaker %s)\n", len(r.Halted), r.Halted[0].At, r.Halted[0].Breaker)
		}
		tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  POLICY\tTRIPS\tDELETIONS\tHEALTHY-CAUSE DELETED\tBROKEN UNREPAIRED\tLONE REPAIRED\tTTR MEAN\tTTR MAX\tREPAIRS HELD")
		for _, p := range r.Policies {
			s := p.Summary
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%d\n", p.Policy, s.Trips, s.Deletions, s.HealthyCauseDeleted,
				s.BrokenUnrepaired, s.LoneRepaired, seconds(s.LoneTTRMeanSeconds), seconds(s.LoneTTRMaxSeconds), s.RepairsHeld)
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write results: %w", err)
		}
		if p := r.Policy(simulate.PolicyFleetRepair); p != nil {
			for _, t := range p.Trips {
				fmt.Fprintf(&b, "  breaker %s at %s: %s\n", t.Change, t.At, t.Message)
			}
		}
	}
	if _, err := io.WriteString(out, b.String()); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}
