package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetrepair/fleetrepair/web/api"
)

func newBreakersCmd() *cobra.Command {
	var server, token, output string
	cmd := &cobra.Command{
		Use:   "breakers",
		Short: "Cohort breakers: list, resume (admin), kill switch (admin)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("missing subcommand: breakers list|resume|kill-switch (see --help)")
		},
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&server, "server", serverDefault(), "controller base URL (env FLEETREPAIR_SERVER)")
	pf.StringVar(&token, "token", envOr("FLEETREPAIR_TOKEN", ""), "your operator token (env FLEETREPAIR_TOKEN)")
	pf.StringVarP(&output, "output", "o", "table", "output format: table or json")

	list := &cobra.Command{
		Use:   "list",
		Short: "Open breakers with their evidence, and the newest decisions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("--output %q: want table or json", output)
			}
			var v api.BreakerView
			if err := getJSON(cmd.Context(), server+"/api/v1/breakers", &v); err != nil {
				return err
			}
			if output == "json" {
				return writeIndented(cmd.OutOrStdout(), v)
			}
			w := cmd.OutOrStdout()
			if v.State.KillSwitch.On {
				fmt.Fprintf(w, "KILL SWITCH ON since %s by %s: %s\n\n", v.State.KillSwitch.Since.Format(time.RFC3339), v.State.KillSwitch.Actor, v.State.KillSwitch.Reason)
			}
			cohorts := v.State.OpenCohorts()
			sort.Strings(cohorts)
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "OPEN COHORT\tSINCE\tEVIDENCE\tHALT ROLLOUT")
			for _, c := range cohorts {
				b := v.State.Cohorts[c]
				ev, _ := json.Marshal(b.Evidence)
				fmt.Fprintf(tw, "%s\t%s\t%s\t%t\n", c, b.Since.Format(time.RFC3339), ev, b.HaltRollout)
			}
			if v.State.Ceiling != nil {
				fmt.Fprintf(tw, "fleet (ceiling)\t%s\t\t\n", v.State.Ceiling.Since.Format(time.RFC3339))
			}
			_ = tw.Flush()
			fmt.Fprintln(w, "\nRecent decisions:")
			for _, d := range v.Decisions {
				fmt.Fprintf(w, "  %s  %s %s: %s -> %s (%s, %s) %s\n", d.At, d.Scope, d.Cohort, d.From, d.To, d.Cause, d.Actor, d.Message)
			}
			return nil
		},
	}
	var reason string
	resume := &cobra.Command{
		Use:   "resume COHORT --reason TEXT",
		Short: `Close an open breaker ("zone=us-east-1a", or "fleet" for the ceiling); its held repairs then drain, paced`,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return breakerPost(cmd, server+"/api/v1/breakers/resume", token, api.BreakerRequest{Cohort: args[0], Reason: reason})
		},
	}
	kill := &cobra.Command{
		Use:       "kill-switch on|off --reason TEXT",
		Short:     "Stop every repair in every cluster (on), or let them go on (off)",
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{"on", "off"},
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] != "on" && args[0] != "off" {
				return fmt.Errorf("kill-switch %q: want on or off", args[0])
			}
			on := args[0] == "on"
			return breakerPost(cmd, server+"/api/v1/breakers/kill-switch", token, api.BreakerRequest{On: &on, Reason: reason})
		},
	}
	for _, c := range []*cobra.Command{resume, kill} {
		c.Flags().StringVar(&reason, "reason", "", "why (required; recorded in the breaker audit)")
	}
	cmd.AddCommand(list, resume, kill)
	return cmd
}

func breakerPost(cmd *cobra.Command, url, token string, req api.BreakerRequest) error {
	if strings.TrimSpace(req.Reason) == "" {
		return errors.New("--reason is required")
	}
	body, _ := json.Marshal(req)
	var out json.RawMessage
	if err := postJSON(cmd.Context(), url, token, body, &out); err != nil {
		return err
	}
	fmt.Fprintln(cmd.OutOrStdout(), "ok")
	return nil
}
