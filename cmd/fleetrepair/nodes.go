package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/web/api"
)

func newNodesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List nodes with their health, and show one node's monitors, diagnoses and repairs",
		Long: `A node's health is ok, failing (an active condition diagnosis) or unknown (its agent is silent,
or its cluster's API server unreachable: never healthy, never repaired on). "nodes list" shows
them with the reason and the agent's last report; "nodes show CLUSTER/NODE" shows the agent's
monitors, the node's diagnoses and its repairs.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("missing subcommand: nodes list|show (see --help)")
		},
	}
	conn := addConnectionFlags(cmd)
	output := addOutputFlag(cmd, outTable, outWide, outJSON, outYAML)

	var q api.NodeQuery
	var all bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List nodes by cluster and name with their health and why",
		Long: `List nodes by cluster and name, one page at a time (--limit, default 50), with their health,
why, and how long ago their agent last reported. --health attention lists the failing and
unknown ones: after an install every node should be ok.

  fleetrepair nodes list --health attention
  fleetrepair nodes list --cluster prod-us-east-1 --nodepool gpu-h100 -o wide`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkLimit(q.Limit); err != nil {
				return err
			}
			c, t, err := conn.client()
			if err != nil {
				return err
			}
			var page api.NodeList
			page.Items, page.NextCursor, err = allPages(all, q.Cursor, func(cursor string) ([]api.NodeItem, string, error) {
				q.Cursor = cursor
				p, err := c.Nodes(cmd.Context(), q)
				return p.Items, p.NextCursor, err
			})
			if err != nil {
				return reachErr(t, err)
			}
			next := nextPageHint(cmd, conn, "nodes", page.NextCursor)
			if done, err := printListData(cmd, *output, page, next); done {
				return err
			}
			w := cmd.OutOrStdout()
			if len(page.Items) == 0 {
				fmt.Fprintln(w, "No nodes match.")
				return nil
			}
			writeNodes(w, page.Items, *output == outWide, time.Now())
			if next != "" {
				fmt.Fprintln(w, "\n"+next)
			}
			return nil
		},
	}
	lf := list.Flags()
	lf.StringVar(&q.Cluster, "cluster", "", "only this cluster")
	lf.StringVar(&q.NodePool, "nodepool", "", "only this NodePool")
	lf.StringVar(&q.Zone, "zone", "", "only this zone")
	lf.StringVar(&q.Search, "name", "", "only nodes whose name contains this")
	lf.StringVar(&q.Health, "health", "", "only this health: ok, failing, unknown, or attention (failing or unknown)")
	lf.BoolVar(&q.IncludeRemoved, "include-removed", false, "also list nodes whose Kubernetes Node is gone (replaced, scaled down); their history stays readable with nodes show")
	lf.IntVar(&q.Limit, "limit", 50, "page size (1-500)")
	lf.StringVar(&q.Cursor, "cursor", "", "continue after the page that printed this cursor")
	lf.BoolVar(&all, "all", false, "follow the cursor through every page")

	show := &cobra.Command{
		Use:   "show CLUSTER/NODE",
		Short: "Show one node: health, agent and monitors, diagnoses, repairs",
		Long: `Show one node: its health and why, what its agent last reported (versions, every monitor's state
with its reason: an unknown monitor says exactly why), its diagnoses (newest first) and its repairs.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cluster, node, ok := strings.Cut(args[0], "/")
			if !ok || cluster == "" || node == "" {
				return fmt.Errorf("node %q: want CLUSTER/NODE (the NODE column of nodes list)", args[0])
			}
			c, t, err := conn.client()
			if err != nil {
				return err
			}
			d, err := c.Node(cmd.Context(), cluster, node)
			if err != nil {
				return reachErr(t, err)
			}
			if *output == outJSON || *output == outYAML {
				return printData(cmd.OutOrStdout(), *output, d)
			}
			writeNode(cmd.OutOrStdout(), d, time.Now())
			return nil
		},
	}
	cmd.AddCommand(list, show)
	return cmd
}

func lastSeen(t *time.Time, now time.Time) string {
	if t == nil || t.IsZero() {
		return "never"
	}
	return age(now.Sub(*t)) + " ago"
}

func writeNodes(w io.Writer, ns []api.NodeItem, wide bool, now time.Time) {
	tw := table(w)
	if wide {
		fmt.Fprintln(tw, "NODE\tHEALTH\tWHY\tAGENT SEEN\tREPAIR\tNODEPOOL\tZONE\tINSTANCE TYPE\tDRIVER\tAGENT")
	} else {
		fmt.Fprintln(tw, "NODE\tHEALTH\tWHY\tAGENT SEEN\tREPAIR")
	}
	for _, n := range ns {
		repair := "-"
		if n.OpenRepairID != 0 {
			repair = fmt.Sprintf("%d %s", n.OpenRepairID, n.OpenRepairState)
		}
		if wide {
			fmt.Fprintf(tw, "%s/%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Cluster, n.Name, n.Health, dash(n.HealthReason), lastSeen(n.LastSeen, now), repair,
				dash(n.NodePool), dash(n.Zone), dash(n.InstanceType), dash(n.DriverVersion), dash(n.AgentVersion))
		} else {
			fmt.Fprintf(tw, "%s/%s\t%s\t%s\t%s\t%s\n", n.Cluster, n.Name, n.Health, dash(n.HealthReason), lastSeen(n.LastSeen, now), repair)
		}
	}
	_ = tw.Flush()
}

func writeNode(w io.Writer, d api.NodeDetail, now time.Time) {
	n := d.Node
	fmt.Fprintf(w, "Node %s/%s  %s: %s\n", n.Cluster, n.Name, d.Health, dash(d.HealthReason))
	fmt.Fprintf(w, "NodePool: %s  zone: %s  instance type: %s  NodeClaim: %s\n", dash(n.NodePool), dash(n.Zone), dash(n.InstanceType), dash(n.NodeClaim))
	fmt.Fprintf(w, "Agent:    %s, last report %s, boot %s, driver %s, kernel %s\n", dash(n.AgentVersion), lastSeen(n.LastSeen, now), dash(n.BootID),
		dash(n.DriverVersion), dash(n.KernelVersion))
	if hb := n.Heartbeat; hb != nil && len(hb.Monitors) > 0 {
		fmt.Fprintln(w, "\nMonitors:")
		tw := table(w)
		for _, m := range hb.Monitors {
			fmt.Fprintf(tw, "  %s\t%s\tsince %s\t%s\n", m.Name, m.State, ts(m.Since), m.Reason)
		}
		_ = tw.Flush()
	}
	fmt.Fprintf(w, "\nDiagnoses (%d):\n", len(d.Diagnoses))
	tw := table(w)
	for _, x := range d.Diagnoses {
		active := "cleared"
		if x.Active {
			active = "ACTIVE"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\tfirst %s\tlast %s\n", x.Reason, x.Severity, x.Action, active, ts(x.FirstSeen), ts(x.LastSeen))
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nRepairs (%d):\n", len(d.Repairs))
	if len(d.Repairs) > 0 {
		writeRepairs(w, d.Repairs, nil, false, now)
	}
	fmt.Fprintf(w, "\nFindings: %d (fleetrepair nodes show %s/%s -o json lists them)\n", len(d.Findings), n.Cluster, n.Name)
}

// checkLimit refuses a --limit outside the API's page sizes, 1 to
// store.MaxListLimit: the client leaves a limit of 0 or less out of the
// request, so --limit 0 or --limit -1 would silently list a default page.
func checkLimit(limit int) error {
	if limit < 1 || limit > store.MaxListLimit {
		return fmt.Errorf("--limit %d: want 1..%d (a page size)", limit, store.MaxListLimit)
	}
	return nil
}
