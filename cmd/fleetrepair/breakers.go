package main

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/web/api"
)

func newBreakersCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "breakers",
		Short: "Cohort breakers: list them with their evidence, resume one (admin), the kill switch (admin)",
		Long: `A cohort breaker opens when the nodes of one cohort (a zone, NodePool, instance type, driver or
kernel version) fail together far more than the rest of the fleet: the fault is likely not in the
nodes, so their repairs are held for on-call instead of replacing half a zone. "breakers list" shows
each open breaker's evidence in words and numbers and how many repairs it holds; "breakers resume"
closes one (its held repairs then drain, paced, each naming your resume in its audit);
"breakers kill-switch on" stops every repair everywhere. docs/breakers.md explains the test.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("missing subcommand: breakers list|resume|kill-switch (see --help)")
		},
	}
	conn := addConnectionFlags(cmd)
	output := addOutputFlag(cmd, outTable, outWide, outJSON, outYAML)

	list := &cobra.Command{
		Use:   "list",
		Short: "Open breakers with their evidence, the repairs they hold, the kill switch and recent decisions",
		Long: `List the open cohort breakers: each one's evidence in words and numbers (failing nodes in the
cohort vs the rest of the fleet, the p-value of the test, the window), since when it is open and how
many repairs it holds; the fleet ceiling and the kill switch when on; and the newest decisions (10,
every one of the newest 100 with -o wide).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := conn.client()
			if err != nil {
				return err
			}
			v, err := c.Breakers(cmd.Context())
			if err != nil {
				return reachErr(t, err)
			}
			if *output == outJSON || *output == outYAML {
				return printData(cmd.OutOrStdout(), *output, v)
			}
			a, err := c.Approvals(cmd.Context())
			if err != nil {
				return reachErr(t, err)
			}
			writeBreakers(cmd.OutOrStdout(), v, a, conn.again(), *output == outWide, time.Now())
			return nil
		},
	}
	var reason string
	resume := &cobra.Command{
		Use:   "resume COHORT --reason TEXT",
		Short: `Close an open breaker ("zone=us-east-1a", or "fleet" for the ceiling) so its held repairs drain (admin)`,
		Long: `Close an open breaker: you looked at its evidence and the cohort's failures are real node faults
(or the outage is over). Its held repairs are then released, a few per pass, each re-validated and
taken through the budgets; each one's audit names your resume (user and reason). Nodes that were
failing at the resume do not trip it again; new failures can.

  fleetrepair breakers resume zone=us-east-1c --reason "AZ recovered, replace the broken nodes"`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(reason) == "" {
				return errors.New("--reason is required: it is recorded in the breaker audit with your name")
			}
			c, t, err := conn.client()
			if err != nil {
				return err
			}
			st, err := c.Resume(cmd.Context(), args[0], reason)
			if err != nil {
				return reachErr(t, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "breaker %s resumed; %d breaker(s) still open. Its held repairs now drain, paced:\n  fleetrepair repairs list --state awaiting_approval%s\n",
				args[0], openCount(st), conn.again())
			return nil
		},
	}
	kill := &cobra.Command{
		Use:   "kill-switch on|off --reason TEXT",
		Short: "Stop every NodeClaim deletion in every cluster (on), or let them go on (off) (admin)",
		Long: `The kill switch stops every NodeClaim deletion of every cluster at once, whatever the breakers
and approvals say: repairs keep being detected, quarantined and recorded, but none deletes until it is
off again. Use it when the controller itself is suspect.`,
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{"on", "off"},
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] != "on" && args[0] != "off" {
				return fmt.Errorf("kill-switch %q: want on or off", args[0])
			}
			if strings.TrimSpace(reason) == "" {
				return errors.New("--reason is required: it is recorded in the breaker audit with your name")
			}
			c, t, err := conn.client()
			if err != nil {
				return err
			}
			st, err := c.KillSwitch(cmd.Context(), args[0] == "on", reason)
			if err != nil {
				return reachErr(t, err)
			}
			if st.KillSwitch.On {
				fmt.Fprintf(cmd.OutOrStdout(), "kill switch ON: no NodeClaim is deleted anywhere until `fleetrepair breakers kill-switch off`\n")
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "kill switch off: repairs go on within the breakers and budgets\n")
			}
			return nil
		},
	}
	for _, c := range []*cobra.Command{resume, kill} {
		c.Flags().StringVar(&reason, "reason", "", "why (required; recorded in the breaker audit with your name)")
	}
	cmd.AddCommand(list, resume, kill)
	return cmd
}

func openCount(st breaker.State) int {
	n := len(st.OpenCohorts())
	if st.Ceiling != nil {
		n++
	}
	return n
}

func writeBreakers(w io.Writer, v api.BreakerView, a api.Approvals, again string, wide bool, now time.Time) {
	st := v.State
	if st.KillSwitch.On {
		fmt.Fprintf(w, "KILL SWITCH ON since %s (%s ago) by %s: %s\nNo NodeClaim is deleted anywhere until it is off.\n\n", ts(st.KillSwitch.Since),
			age(now.Sub(st.KillSwitch.Since)), st.KillSwitch.Actor, st.KillSwitch.Reason)
	}
	holding := map[string]int{} // open cohort -> held repairs
	for _, g := range a.Groups {
		if _, open := st.Open(g.Cohort); g.HeldBy == "breaker" && open {
			holding[g.Cohort] += len(g.Repairs)
		}
	}
	cohorts := st.OpenCohorts()
	sort.Strings(cohorts)
	type row struct {
		cohort string
		b      breaker.Breaker
	}
	var rows []row
	for _, c := range cohorts {
		rows = append(rows, row{c, st.Cohorts[c]})
	}
	if st.Ceiling != nil {
		rows = append(rows, row{breaker.FleetScope, *st.Ceiling})
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "No open breakers: repairs proceed within the budgets.")
	} else {
		tw := table(w)
		if wide {
			fmt.Fprintln(tw, "OPEN BREAKER\tAGE\tHOLDS\tEVIDENCE\tHALT-ROLLOUT\tSINCE\tLAST FAILURE")
		} else {
			fmt.Fprintln(tw, "OPEN BREAKER\tAGE\tHOLDS\tEVIDENCE")
		}
		for _, r := range rows {
			holds := fmt.Sprintf("%d repairs", holding[r.cohort])
			if wide {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%t\t%s\t%s\n", r.cohort, age(now.Sub(r.b.Since)), holds, api.ExplainBreaker(r.b), r.b.HaltRollout,
					ts(r.b.Since), ts(r.b.LastFailure))
			} else {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.cohort, age(now.Sub(r.b.Since)), holds, api.ExplainBreaker(r.b))
			}
		}
		_ = tw.Flush()
		fmt.Fprintf(w, "\nTo see what one holds: fleetrepair repairs list --state awaiting_approval%s\n", again)
		fmt.Fprintf(w, "To release it (admin): fleetrepair breakers resume %s --reason 'WHY'%s\n", quote(rows[0].cohort), again)
	}
	if other := a.Total - sum(holding); other > 0 {
		fmt.Fprintf(w, "\n%d repair(s) await approval not held by an open breaker: fleetrepair repairs list --state awaiting_approval%s\n", other, again)
	}
	ds := v.Decisions
	if !wide && len(ds) > 10 {
		ds = ds[:10]
	}
	if len(ds) == 0 {
		return
	}
	fmt.Fprintf(w, "\nRecent decisions (%d of %d):\n", len(ds), len(v.Decisions))
	tw := table(w)
	fmt.Fprintln(tw, "  AT\tBREAKER\tCHANGE\tCAUSE\tACTOR\tMESSAGE")
	for _, d := range ds {
		scope := d.Cohort
		if scope == "" {
			scope = d.Scope
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s -> %s\t%s\t%s\t%s\n", d.At, scope, d.From, d.To, d.Cause, d.Actor, d.Message)
	}
	_ = tw.Flush()
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
