package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fleetrepair/fleetrepair/web/api"
)

// decisionHelp is each verb's help: what the decision does and does not do.
var decisionHelp = map[string]struct{ short, long string }{
	"approve": {
		short: "Approve a repair awaiting approval: let the controller replace the node (approver token)",
		long: `Approve a repair that waits for on-call (state awaiting_approval; "fleetrepair repairs show ID"
says what holds it). The approval is recorded in the repair's audit with your name (the operator
of your token) and your --reason.

An approval deletes nothing by itself: the controller re-validates the repair (the node is still
unhealthy, its NodeClaim is the same one) and takes it through the deletion budgets and the kill
switch like any deletion. Approving a repair held by a cohort breaker overrides the breaker for this
one repair only; "fleetrepair breakers resume COHORT" releases all of them.

  fleetrepair approve 412 --reason "GPU fell off the bus, zone is healthy again"`,
	},
	"reject": {
		short: "Reject a repair awaiting approval: the node is not replaced (approver token)",
		long: `Reject a repair that waits for on-call (state awaiting_approval; "fleetrepair repairs show ID"
says what holds it). The repair closes as rejected: its NodeClaim is never deleted by it, and the
rejection is recorded in the repair's audit with your name (the operator of your token) and your
--reason. The node stays quarantined (its NodeCondition and NoSchedule taint) while the diagnosis
is active; the same reason does not open another repair on this NodeClaim, a different one (an
escalation) or a new NodeClaim does.

Reject when the evidence is wrong or the fault is outside the node (a zone outage, a bad rollout):
a replacement would fail the same way.

  fleetrepair reject 412 --reason "zone-wide outage, not this node"`,
	},
}

// newDecisionCmd builds `fleetrepair approve|reject ID --reason ...`.
func newDecisionCmd(verb string) *cobra.Command {
	var reason string
	h := decisionHelp[verb]
	cmd := &cobra.Command{
		Use:   verb + " ID --reason TEXT",
		Short: h.short,
		Long:  h.long,
		Args:  cobra.ExactArgs(1),
	}
	conn := addConnectionFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		id, err := strconv.ParseInt(args[0], 10, 64)
		if err != nil || id <= 0 {
			return fmt.Errorf("repair id %q: want a positive number (the ID column of repairs list)", args[0])
		}
		if strings.TrimSpace(reason) == "" {
			return errors.New("--reason is required: it is recorded in the audit with your name")
		}
		c, t, err := conn.client()
		if err != nil {
			return err
		}
		decide := c.Approve
		if verb == "reject" {
			decide = c.Reject
		}
		r, err := decide(cmd.Context(), id, reason)
		if err != nil {
			return reachErr(t, err)
		}
		fmt.Fprintf(cmd.OutOrStdout(), "repair %d %s/%s: %s\n%s\n", r.ID, r.Cluster, r.Node, r.State, decisionNext(r, conn.again()))
		return nil
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (required; recorded in the audit with your name)")
	return cmd
}

func decisionNext(r api.Repair, again string) string {
	if r.State == "rejected" {
		return "Its NodeClaim will not be deleted."
	}
	return fmt.Sprintf("The controller now re-validates it and deletes its NodeClaim within the budgets; follow it with\n  fleetrepair repairs show %d%s", r.ID, again)
}
