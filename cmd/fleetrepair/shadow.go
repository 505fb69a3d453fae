package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetrepair/fleetrepair/controller/shadow"
)

func newShadowCmd() *cobra.Command {
	var since, until string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "shadow --since 168h [--until RFC3339]",
		Short: "What the current policy would have done with the stored findings: deletions, breaker trips, approvals",
		Long: `shadow asks the controller (GET /api/v1/shadow) to replay the findings stored for
[since, until) through the current diagnosis rules, policy file, cohort breakers,
approval rules and deletion budgets, as if repair had been on, and prints what it
would have done. docs/shadow.md describes the model and its limits. It needs an
operator token of the viewer role or above.

--since and --until take an RFC 3339 time or a duration before now (168h, 7d).`,
		Args: cobra.NoArgs,
	}
	conn := addConnectionFlags(cmd)
	output := addOutputFlag(cmd, outTable, outJSON, outYAML)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		now := time.Now()
		if since == "" {
			return errors.New("--since is required (e.g. --since 168h)")
		}
		from, err := rangeTime(since, now)
		if err != nil {
			return fmt.Errorf("--since: %w", err)
		}
		var to time.Time
		if until != "" {
			if to, err = rangeTime(until, now); err != nil {
				return fmt.Errorf("--until: %w", err)
			}
		}
		c, t, err := conn.client()
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
		defer cancel()
		rep, err := c.Shadow(ctx, from.UTC().Truncate(time.Second), to.UTC().Truncate(time.Second))
		if err != nil {
			return reachErr(t, err)
		}
		if *output != outTable {
			return printData(cmd.OutOrStdout(), *output, rep)
		}
		return writeShadowTable(cmd.OutOrStdout(), &rep)
	}
	f := cmd.Flags()
	f.StringVar(&since, "since", "", "start of the range: RFC 3339, or a duration before now (168h, 7d); required")
	f.StringVar(&until, "until", "", "end of the range: RFC 3339, or a duration before now (default: now)")
	f.DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for the report (a week of a large fleet takes a while)")
	return cmd
}

// rangeTime reads an RFC 3339 time, or a duration before now
// (shadow.RangeTime: the dashboard's shadow page reads bounds the same way).
func rangeTime(s string, now time.Time) (time.Time, error) { return shadow.RangeTime(s, now) }

func writeShadowTable(w io.Writer, rep *shadow.Report) error {
	ts := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	breakers, byBreaker := "off", 0
	if b := rep.Policy.Breakers; b != nil {
		breakers = fmt.Sprintf("on (window %s, at least %d failing nodes, alpha %g)", b.Window, b.MinFailing, b.Alpha)
	}
	for _, a := range rep.ApprovalsNeeded {
		if a.Why == shadow.WhyBreaker {
			byBreaker++
		}
	}
	fmt.Fprintf(w, "Shadow report %s .. %s: %d nodes, %d findings (%d without a time)\n", ts(rep.Since), ts(rep.Until),
		rep.Nodes, rep.Findings, rep.UntimedFindings)
	tol, file := "per reason", "none"
	if rep.Policy.TolerationOverride != "" {
		tol = rep.Policy.TolerationOverride + " for every reason"
	}
	if rep.Policy.PolicyOverrides {
		file = "in force"
	}
	fmt.Fprintf(w, "Policy: breakers %s; toleration %s; policy file %s\n", breakers, tol, file)
	fmt.Fprintf(w, "Would have: deleted %d node(s); asked on-call %d time(s) (%d held by a breaker, %d not executable); tripped %d breaker(s); %d repair(s) delayed by budgets; %d failed\n",
		len(rep.Deletions), len(rep.ApprovalsNeeded), byBreaker, len(rep.ApprovalsNeeded)-byBreaker, len(rep.Trips),
		len(rep.BudgetDelays), len(rep.Failed))

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	section := func(title, header string, n int) bool {
		if n == 0 {
			return false
		}
		fmt.Fprintf(tw, "\n%s\n%s\n", title, header)
		return true
	}
	if section("BREAKER TRIPS", "AT\tCOHORT\tFAILING\tREST\tP\tCLOSED", len(rep.Trips)) {
		for _, tr := range rep.Trips {
			closed := "open at the end"
			if tr.ClosedAt != nil {
				closed = ts(*tr.ClosedAt) + " (" + tr.CloseCause + ")"
			}
			ev := tr.Evidence
			fmt.Fprintf(tw, "%s\t%s\t%d of %d\t%d of %d\t10^%.1f\t%s\n", ts(tr.At), tr.Cohort, ev.CohortFailing, ev.CohortNodes,
				ev.RestFailing, ev.RestNodes, ev.Log10P, closed)
		}
	}
	if section("DELETIONS", "AT\tNODE\tNODEPOOL\tREASON\tAFTER HOLD", len(rep.Deletions)) {
		for _, d := range rep.Deletions {
			fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%s\t%t\n", ts(d.At), d.Cluster, d.Node, d.NodePool, d.Reason, d.Released)
		}
	}
	if section("APPROVALS NEEDED", "AT\tNODE\tREASON\tWHY\tACTION\tOUTCOME", len(rep.ApprovalsNeeded)) {
		for _, a := range rep.ApprovalsNeeded {
			fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%s\t%s\t%s\n", ts(a.At), a.Cluster, a.Node, a.Reason, a.Why, a.Action, a.Outcome)
		}
	}
	if section("BUDGET DELAYS", "AT\tNODE\tREASON\tBUDGET", len(rep.BudgetDelays)) {
		for _, b := range rep.BudgetDelays {
			fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%s\n", ts(b.At), b.Cluster, b.Node, b.Reason, b.Budget)
		}
	}
	if section("FAILED", "AT\tNODE\tREASON\tWHY", len(rep.Failed)) {
		for _, f := range rep.Failed {
			fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%s\n", ts(f.At), f.Cluster, f.Node, f.Reason, f.Why)
		}
	}
	reasons := make([]string, 0, len(rep.ByReason))
	for r := range rep.ByReason {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	if section("BY REASON", "REASON\tREPAIRS\tDELETIONS\tAPPROVALS (BREAKER/ACTION)\tBUDGET DELAYED\tFAILED\tRESOLVED\tEXPIRED", len(reasons)) {
		for _, r := range reasons {
			c := rep.ByReason[r]
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d (%d/%d)\t%d\t%d\t%d\t%d\n", r, c.Repairs, c.Deletions, c.ApprovalsNeeded, c.HeldByBreaker,
				c.NotExecutable, c.BudgetDelayed, c.Failed, c.Resolved, c.Expired)
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write shadow report: %w", err)
	}
	if len(rep.Notes) > 0 {
		fmt.Fprintln(w, "\nNotes:")
		for _, n := range rep.Notes {
			fmt.Fprintln(w, "  - "+n)
		}
	}
	return nil
}
