package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetrepair/fleetrepair/web/api"
	"github.com/fleetrepair/fleetrepair/web/apiclient"
)

func newRepairsCmd() *cobra.Command {
	var server, output string
	cmd := &cobra.Command{
		Use:   "repairs",
		Short: "Repair history through the controller's API",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return errors.New("missing subcommand: repairs list|show (see --help)")
		},
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("--output %q: want table or json", output)
			}
			return nil
		},
	}
	cmd.PersistentFlags().StringVar(&server, "server", serverDefault(), "controller base URL (env FLEETREPAIR_SERVER)")
	cmd.PersistentFlags().StringVarP(&output, "output", "o", "table", "output format: table or json")

	var q struct{ cluster, node, state, reason, since, until string }
	var limit int
	var all bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List repairs, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := url.Values{}
			for k, s := range map[string]string{"cluster": q.cluster, "node": q.node, "state": q.state, "reason": q.reason, "since": q.since, "until": q.until} {
				if s != "" {
					v.Set(k, s)
				}
			}
			v.Set("limit", fmt.Sprint(limit))
			var items []api.Repair
			for {
				var page api.RepairPage
				if err := getJSON(cmd.Context(), server+"/api/v1/repairs?"+v.Encode(), &page); err != nil {
					return err
				}
				items = append(items, page.Items...)
				if !all || page.NextCursor == "" {
					break
				}
				v.Set("cursor", page.NextCursor)
			}
			if output == "json" {
				return writeIndented(cmd.OutOrStdout(), items)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tCLUSTER\tNODE\tSTATE\tREASON\tRECOMMENDED\tEXECUTED\tDRY-RUN\tCREATED")
			for _, r := range items {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%t\t%s\n", r.ID, r.Cluster, r.Node, r.State, r.Reason,
					r.RecommendedAction, dash(r.ExecutedAction), r.DryRun, r.CreatedAt.Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	lf := list.Flags()
	lf.StringVar(&q.cluster, "cluster", "", "only this cluster")
	lf.StringVar(&q.node, "node", "", "only this node")
	lf.StringVar(&q.state, "state", "", "only this state (detected, tolerating, awaiting_approval, deleting, replaced, ...)")
	lf.StringVar(&q.reason, "reason", "", "only this reason code")
	lf.StringVar(&q.since, "since", "", "created at or after (RFC 3339)")
	lf.StringVar(&q.until, "until", "", "created before (RFC 3339)")
	lf.IntVar(&limit, "limit", 50, "page size (1-500)")
	lf.BoolVar(&all, "all", false, "follow the cursor through every page")

	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show one repair: its state, audit trail and the findings behind it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var d api.RepairDetail
			if err := getJSON(cmd.Context(), server+"/api/v1/repairs/"+url.PathEscape(args[0]), &d); err != nil {
				return err
			}
			if output == "json" {
				return writeIndented(cmd.OutOrStdout(), d)
			}
			w := cmd.OutOrStdout()
			r := d.Repair
			fmt.Fprintf(w, "Repair %d  %s/%s  state=%s  dry-run=%t\n", r.ID, r.Cluster, r.Node, r.State, r.DryRun)
			fmt.Fprintf(w, "Reason: %s (%s)  recommended=%s  executed=%s\n", r.Reason, r.FaultClass, r.RecommendedAction, dash(r.ExecutedAction))
			fmt.Fprintf(w, "NodeClaim: %s (uid %s)  NodePool: %s\n", dash(r.NodeClaim), dash(r.NodeClaimUID), dash(r.NodePool))
			fmt.Fprintln(w, "\nAudit:")
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			for _, a := range d.Audit {
				fmt.Fprintf(tw, "  %s\t%s -> %s\t%s\t%s\n", a.At.Format(time.RFC3339), dash(a.From), a.To, a.Actor, a.Reason)
			}
			_ = tw.Flush()
			fmt.Fprintln(w, "\nFindings:")
			for _, f := range d.Findings {
				line := ""
				if len(f.Evidence) > 0 {
					line = f.Evidence[0]
				}
				what := f.Detector
				if f.Xid != 0 {
					what += fmt.Sprintf(" %d", f.Xid)
				}
				fmt.Fprintf(w, "  %s gpu=%s  %s\n", what, dash(f.GPUPCI), line)
			}
			return nil
		},
	}
	cmd.AddCommand(list, show)
	return cmd
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func writeIndented(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// getJSON GETs u and decodes the body into v.
func getJSON(ctx context.Context, u string, v any) error {
	// Reads need a viewer when the controller has operators or a login.
	return callAPI(ctx, http.MethodGet, u, os.Getenv("FLEETREPAIR_TOKEN"), nil, v)
}

// callAPI is apiclient.Call (the CLI and the demo share one client).
func callAPI(ctx context.Context, method, u, token string, body []byte, v any) error {
	return apiclient.Call(ctx, method, u, token, body, v)
}
