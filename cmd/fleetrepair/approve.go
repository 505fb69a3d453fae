package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

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
			"nothing by itself: the controller re-validates the repair and takes it through the budgets and breakers.",
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
	cmd.Flags().StringVar(&server, "server", envOr("FLEETREPAIR_SERVER", "http://127.0.0.1:8080"), "controller base URL (env FLEETREPAIR_SERVER)")
	cmd.Flags().StringVar(&token, "token", envOr("FLEETREPAIR_TOKEN", ""), "your operator token (env FLEETREPAIR_TOKEN)")
	cmd.Flags().StringVar(&reason, "reason", "", "why (required; recorded in the audit)")
	return cmd
}

// postJSON POSTs body with a bearer token and decodes the answer into v; an
// API error envelope becomes an error carrying its message and detail.
func postJSON(ctx context.Context, u, token string, body []byte, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("post %s: %w", u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("read %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e api.ErrorBody
		if json.Unmarshal(b, &e) == nil && e.Message != "" {
			return fmt.Errorf("%s: %s: %s %s", resp.Status, e.Message, e.Detail, strings.Join(e.Validations, "; "))
		}
		return fmt.Errorf("post %s: %s", u, resp.Status)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %s: %w", u, err)
	}
	return nil
}
