package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/web/api"
	"github.com/fleetrepair/fleetrepair/web/apiclient"
)

func newRepairsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "repairs",
		Short: "List and show repairs: what was repaired, what is waiting for you, and why",
		Long: `Repairs are the controller's ledger: one row per node it decided to repair, with every
transition audited (who, when, why). "repairs list" shows them newest first; "repairs show ID"
shows one with its audit trail and the kernel lines behind it, and for a repair awaiting approval
what holds it and the exact commands to approve or reject it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return errors.New("missing subcommand: repairs list|show (see --help)")
		},
	}
	conn := addConnectionFlags(cmd)
	output := addOutputFlag(cmd, outTable, outWide, outJSON, outYAML)
	cmd.AddCommand(newRepairsListCmd(conn, output), newRepairsShowCmd(conn, output))
	return cmd
}

func newRepairsListCmd(conn *connection, output *string) *cobra.Command {
	var q apiclient.RepairQuery
	var since, until string
	var all bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List repairs, newest first, with what holds each waiting one and its age",
		Long: `List repairs, newest first, one page at a time (--limit, default 50). A repair awaiting approval
shows what holds it in HELD-BY: a cohort breaker (breaker zone=us-east-1c), an action this cluster
cannot execute (action), or another rule. When more pages exist the last line says so and gives the
command for the next one; --all follows every page.

  fleetrepair repairs list --state awaiting_approval
  fleetrepair repairs list --node ip-10-0-3-7 -o wide
  fleetrepair repairs list --since 24h -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkLimit(q.Limit); err != nil {
				return err
			}
			now := time.Now()
			var err error
			if since != "" {
				if q.Since, err = rangeTime(since, now); err != nil {
					return fmt.Errorf("--since: %w", err)
				}
			}
			if until != "" {
				if q.Until, err = rangeTime(until, now); err != nil {
					return fmt.Errorf("--until: %w", err)
				}
			}
			c, t, err := conn.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			var page api.RepairPage
			page.Items, page.NextCursor, err = allPages(all, q.Cursor, func(cursor string) ([]api.Repair, string, error) {
				q.Cursor = cursor
				p, err := c.Repairs(ctx, q)
				return p.Items, p.NextCursor, err
			})
			if err != nil {
				return reachErr(t, err)
			}
			next := nextPageHint(cmd, conn, "repairs", page.NextCursor)
			if done, err := printListData(cmd, *output, page, next); done {
				return err
			}
			held := map[int64]string{}
			for _, r := range page.Items {
				if r.State == string(ledger.AwaitingApproval) {
					a, err := c.Approvals(ctx)
					if err != nil {
						return reachErr(t, err)
					}
					held = heldBy(a)
					break
				}
			}
			w := cmd.OutOrStdout()
			if len(page.Items) == 0 {
				fmt.Fprintln(w, "No repairs match.")
				return nil
			}
			writeRepairs(w, page.Items, held, *output == outWide, now)
			if next != "" {
				fmt.Fprintln(w, "\n"+next)
			}
			return nil
		},
	}
	lf := list.Flags()
	lf.StringVar(&q.Cluster, "cluster", "", "only this cluster")
	lf.StringVar(&q.Node, "node", "", "only this node")
	lf.StringVar(&q.State, "state", "", "only this state (detected, tolerating, awaiting_approval, approved, deleting, replaced, rejected, ...)")
	lf.StringVar(&q.Reason, "reason", "", "only this reason code (fleetrepair reasons: GET /api/v1/reasons)")
	lf.StringVar(&since, "since", "", "created at or after: RFC 3339, or a duration before now (24h, 7d)")
	lf.StringVar(&until, "until", "", "created before: RFC 3339, or a duration before now")
	lf.IntVar(&q.Limit, "limit", 50, "page size (1-500)")
	lf.StringVar(&q.Cursor, "cursor", "", "continue after the page that printed this cursor")
	lf.BoolVar(&all, "all", false, "follow the cursor through every page")
	return list
}

// listFlags repeats the filters of a list command for its next-page hint.
func listFlags(cmd *cobra.Command) string {
	var s string
	for _, name := range []string{"cluster", "node", "state", "reason", "since", "until", "limit", "output"} {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
			s += " --" + name + " " + quote(f.Value.String())
		}
	}
	return s
}

// heldBy maps each held repair's id to what holds it, in a few words.
func heldBy(a api.Approvals) map[int64]string {
	out := map[int64]string{}
	for _, g := range a.Groups {
		what := g.HeldBy
		if g.Cohort != "" {
			what += " " + g.Cohort
		}
		for _, r := range g.Repairs {
			out[r.ID] = what
		}
	}
	return out
}

func writeRepairs(w io.Writer, rs []api.Repair, held map[int64]string, wide bool, now time.Time) {
	tw := table(w)
	if wide {
		fmt.Fprintln(tw, "ID\tNODE\tSTATE\tREASON\tHELD-BY\tAGE\tIN-STATE\tNODEPOOL\tNODECLAIM\tRECOMMENDED\tEXECUTED\tDRY-RUN\tCREATED")
	} else {
		fmt.Fprintln(tw, "ID\tNODE\tSTATE\tREASON\tHELD-BY\tAGE")
	}
	for _, r := range rs {
		h := held[r.ID]
		if h == "" && r.State == string(ledger.AwaitingApproval) {
			h, _ = r.Detail["held_by"].(string)
		}
		if wide {
			fmt.Fprintf(tw, "%d\t%s/%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%t\t%s\n", r.ID, r.Cluster, r.Node, r.State, r.Reason, dash(h),
				age(now.Sub(r.CreatedAt)), age(now.Sub(r.UpdatedAt)), dash(r.NodePool), dash(r.NodeClaim), r.RecommendedAction,
				dash(r.ExecutedAction), r.DryRun, ts(r.CreatedAt))
		} else {
			fmt.Fprintf(tw, "%d\t%s/%s\t%s\t%s\t%s\t%s\n", r.ID, r.Cluster, r.Node, r.State, r.Reason, dash(h), age(now.Sub(r.CreatedAt)))
		}
	}
	_ = tw.Flush()
}

func newRepairsShowCmd(conn *connection, output *string) *cobra.Command {
	return &cobra.Command{
		Use:   "show ID",
		Short: "Show one repair: state, audit trail, findings, and for a held one how to approve or reject it",
		Long: `Show one repair: its node, reason, recommended and executed action, the audit trail (every
transition with its time, actor and reason: a human's approval, rejection or breaker resume names
them), and the findings behind it with their raw kernel lines. For a repair awaiting approval it says
what holds it (the breaker's evidence in numbers), since when, when it expires, and the exact
commands that approve or reject it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || id <= 0 {
				return fmt.Errorf("repair id %q: want a positive number (the ID column of repairs list)", args[0])
			}
			c, t, err := conn.client()
			if err != nil {
				return err
			}
			d, err := c.Repair(cmd.Context(), id)
			if err != nil {
				return reachErr(t, err)
			}
			if *output == outJSON || *output == outYAML {
				return printData(cmd.OutOrStdout(), *output, d)
			}
			var group *api.ApprovalGroup
			var held *api.HeldRepair
			if d.Repair.State == string(ledger.AwaitingApproval) {
				group, held, err = findHeld(cmd.Context(), c, id)
				if err != nil {
					return reachErr(t, err)
				}
			}
			writeRepair(cmd.OutOrStdout(), d, group, held, conn.again(), *output == outWide, time.Now())
			return nil
		},
	}
}

// findHeld finds repair id in the approval queue.
func findHeld(ctx context.Context, c *apiclient.Client, id int64) (*api.ApprovalGroup, *api.HeldRepair, error) {
	a, err := c.Approvals(ctx)
	if err != nil {
		return nil, nil, err
	}
	for gi := range a.Groups {
		for ri := range a.Groups[gi].Repairs {
			if a.Groups[gi].Repairs[ri].ID == id {
				return &a.Groups[gi], &a.Groups[gi].Repairs[ri], nil
			}
		}
	}
	return nil, nil, nil
}

func writeRepair(w io.Writer, d api.RepairDetail, g *api.ApprovalGroup, h *api.HeldRepair, again string, wide bool, now time.Time) {
	r := d.Repair
	dry := ""
	if r.DryRun {
		dry = "  (dry run: deletes nothing)"
	}
	fmt.Fprintf(w, "Repair %d  %s/%s  %s%s\n", r.ID, r.Cluster, r.Node, r.State, dry)
	fmt.Fprintf(w, "Reason:     %s (%s)\n", r.Reason, r.FaultClass)
	fmt.Fprintf(w, "Action:     recommended %s, executed %s\n", r.RecommendedAction, dash(r.ExecutedAction))
	fmt.Fprintf(w, "NodeClaim:  %s (uid %s)  NodePool: %s\n", dash(r.NodeClaim), dash(r.NodeClaimUID), dash(r.NodePool))
	fmt.Fprintf(w, "Created:    %s (%s ago), last change %s ago\n", ts(r.CreatedAt), age(now.Sub(r.CreatedAt)), age(now.Sub(r.UpdatedAt)))
	if r.State == string(ledger.AwaitingApproval) {
		fmt.Fprintln(w)
		switch {
		case g == nil || h == nil:
			fmt.Fprintln(w, "Awaiting approval (not in the approval queue any more: it was decided a moment ago, run show again).")
		default:
			what := g.HeldBy
			if g.Cohort != "" {
				what += " " + g.Cohort
			}
			fmt.Fprintf(w, "AWAITING APPROVAL, held by %s: %s\n", what, g.Explanation)
			fmt.Fprintf(w, "Held since %s (%s), expires %s (in %s) without a decision.\n", ts(h.HeldSince), age(now.Sub(h.HeldSince)),
				ts(h.ExpiresAt), age(h.ExpiresAt.Sub(now)))
		}
		fmt.Fprintf(w, "To approve it (approver token; the controller re-validates it and takes it through the budgets):\n")
		fmt.Fprintf(w, "  fleetrepair approve %d --reason 'WHY'%s\n", r.ID, again)
		fmt.Fprintf(w, "To reject it (its NodeClaim is never deleted; the repair closes as rejected):\n")
		fmt.Fprintf(w, "  fleetrepair reject %d --reason 'WHY'%s\n", r.ID, again)
		if g != nil && g.HeldBy == "breaker" && g.Cohort != "" {
			fmt.Fprintf(w, "To release every repair this breaker holds (admin token; they drain paced, each re-validated):\n")
			fmt.Fprintf(w, "  fleetrepair breakers resume %s --reason 'WHY'%s\n", quote(g.Cohort), again)
		}
	}
	fmt.Fprintln(w, "\nAudit:")
	tw := table(w)
	fmt.Fprintln(tw, "  AT\tCHANGE\tACTOR\tREASON")
	for _, a := range d.Audit {
		fmt.Fprintf(tw, "  %s\t%s -> %s\t%s\t%s\n", ts(a.At), dash(a.From), a.To, a.Actor, a.Reason)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nFindings (%d):\n", len(d.Findings))
	for _, f := range d.Findings {
		what := f.Detector
		if f.Xid != 0 {
			what += fmt.Sprintf(" Xid %d", f.Xid)
		}
		when := "-"
		if !f.Time.IsZero() {
			when = ts(f.Time)
		}
		fmt.Fprintf(w, "  %s  %s  gpu=%s  x%d\n", when, what, dash(f.GPUPCI), f.Count)
		lines := f.Evidence
		if !wide && len(lines) > 3 {
			lines = lines[:3]
		}
		for _, l := range lines {
			fmt.Fprintf(w, "      %s\n", l)
		}
		if len(lines) < len(f.Evidence) {
			fmt.Fprintf(w, "      (%d more lines: -o wide)\n", len(f.Evidence)-len(lines))
		}
	}
}
