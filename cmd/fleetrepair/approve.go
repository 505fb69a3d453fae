package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fleetrepair/fleetrepair/web/api"
)

// newDecisionCmd builds `fleetrepair approve|reject ID --reason ...`.
func newDecisionCmd(verb string) *cobra.Command {
	var server, token, reason string
	cmd := &cobra.Command{
		Use:   verb + " ID --reason TEXT",
		Short: strings.ToUpper(verb[:1]) + verb[1:] + " a repair awaiting approval (needs an approver token)",
		Long: "The decision is recorded in the repair's audit with your identity and reason. An approval deletes\n" +
			"nothing by itself: the controller re-validates the repair (node still unhealthy, NodeClaim unchanged)\n" +
			"and takes it through the deletion budgets and the kill switch. An approval overrides a cohort breaker\n" +
			"for this one repair: that is what approving a held repair means.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(reason) == "" {
				return errors.New("--reason is required")
			}
			body, _ := json.Marshal(api.DecisionRequest{Reason: reason})
			var r api.Repair
			if err := postJSON(cmd.Context(), server+"/api/v1/repairs/"+url.PathEscape(args[0])+"/"+verb, token, body, &r); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "repair %d %s/%s: %s\n", r.ID, r.Cluster, r.Node, r.State)
			return nil
		},
	}
	cmd.Flags().StringVar(&server, "server", serverDefault(), "controller base URL (env FLEETREPAIR_SERVER)")
	cmd.Flags().StringVar(&token, "token", envOr("FLEETREPAIR_TOKEN", ""), "your operator token (env FLEETREPAIR_TOKEN)")
	cmd.Flags().StringVar(&reason, "reason", "", "why (required; recorded in the audit)")
	return cmd
}

// postJSON POSTs body with a bearer token and decodes the answer into v.
func postJSON(ctx context.Context, u, token string, body []byte, v any) error {
	return callAPI(ctx, http.MethodPost, u, token, body, v)
}
