package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"

	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// Caller is who asks for a command and from where, for the role check and
// the audits.
type Caller struct {
	Operator auth.Operator
	// Via names the client: "api" (bearer token) or "dashboard" (login session).
	Via string
	// RemoteAddr is the client's address, for the security audit.
	RemoteAddr string
}

func (c Caller) actor() string { return "user:" + c.Operator.Name }

// authorize checks that the caller has at least role want for action,
// recording a refusal in the security audit (sampled like every denial). It returns a 403 Problem.
func (s *server) authorize(ctx context.Context, c Caller, want auth.Role, action string) error {
	if c.Operator.Role.Allows(want) {
		return nil
	}
	err := fmt.Errorf("operator %s has role %s, %s needs %s: %w", c.Operator.Name, c.Operator.Role, action, want, auth.ErrForbidden)
	s.audit(ctx, store.SecurityEvent{Subject: c.Operator.Name, Action: action, Outcome: "denied",
		Status: http.StatusForbidden, Reason: err.Error(), RemoteAddr: c.RemoteAddr}) // counted, sampled (guard.go)
	return &Problem{Status: http.StatusForbidden, Message: "operator not allowed", Detail: err.Error()}
}

// Decide moves repair id from awaiting_approval to to (ledger.Approved or
// ledger.Rejected) for an approver, with a required reason, audited with the
// caller's identity. An approval deletes nothing by itself: the reconciler
// re-validates the repair (node still unhealthy, NodeClaim UID unchanged)
// and takes it through the budgets and the kill switch like any deletion.
// Errors: a Problem (400 no reason, 403 role, 409 not awaiting approval) or
// a store error.
func (sv *Service) Decide(ctx context.Context, c Caller, id int64, to ledger.State, reason string) (Repair, error) {
	s := sv.s
	if to != ledger.Approved && to != ledger.Rejected {
		return Repair{}, badRequest("invalid decision", fmt.Sprintf("to: %q is not approved or rejected", to))
	}
	if err := s.authorize(ctx, c, auth.RoleApprover, verb(to)+" repair"); err != nil {
		return Repair{}, err
	}
	if strings.TrimSpace(reason) == "" {
		return Repair{}, badRequest("invalid decision", "reason: required (why you "+verb(to)+" this repair)")
	}
	rp, err := s.cfg.Store.Transition(ctx, store.TransitionRequest{ID: id, From: ledger.AwaitingApproval, To: to,
		Actor: c.actor(), Reason: reason, Detail: map[string]any{"role": string(c.Operator.Role), "via": c.Via}}, s.cfg.Now())
	if errors.Is(err, store.ErrConflict) {
		detail := "the repair is no longer awaiting approval"
		if cur, gerr := s.cfg.Store.GetRepair(ctx, id); gerr == nil {
			detail = fmt.Sprintf("the repair is %s, not awaiting_approval", cur.State)
		}
		return Repair{}, &Problem{Status: http.StatusConflict, Message: "cannot " + verb(to) + " this repair", Detail: detail}
	}
	if err != nil {
		return Repair{}, err
	}
	if s.cfg.OnIngest != nil {
		s.cfg.OnIngest(rp.Cluster, rp.Node) // let the reconciler act on the decision now
	}
	return toRepair(rp), nil
}

// Resume closes an open breaker (a cohort "key=value", or "fleet" for the
// ceiling) for an admin, with a required reason; held repairs then drain at
// the paced rate. Errors: a Problem (400 bad cohort or no reason, 403 role,
// 409 not open or the state kept changing) or a store error.
func (sv *Service) Resume(ctx context.Context, c Caller, cohort, reason string) (breaker.State, error) {
	if err := sv.s.authorize(ctx, c, auth.RoleAdmin, "resume breaker"); err != nil {
		return breaker.State{}, err
	}
	var problems []string
	if strings.TrimSpace(reason) == "" {
		problems = append(problems, "reason: required")
	}
	if cohort == "" {
		problems = append(problems, `cohort: required (e.g. "zone=us-east-1a", or "fleet")`)
	} else if cohort != breaker.FleetScope {
		if _, err := breaker.ParseCohort(cohort); err != nil {
			problems = append(problems, fmt.Sprintf("cohort: %v (want key=value, e.g. zone=us-east-1a, or %q)", err, breaker.FleetScope))
		}
	}
	if len(problems) > 0 {
		return breaker.State{}, badRequest("invalid request", problems...)
	}
	return sv.s.changeBreakers(ctx, func(st breaker.State) (breaker.State, breaker.Decision, error) {
		st, d, err := breaker.Resume(st, cohort, c.actor(), reason, sv.s.cfg.Now())
		if err != nil {
			status := http.StatusBadRequest
			if errors.Is(err, breaker.ErrNotOpen) {
				status = http.StatusConflict
			}
			return st, d, &Problem{Status: status, Message: "cannot resume " + cohort, Detail: err.Error()}
		}
		return st, d, nil
	})
}

// SetKillSwitch switches every NodeClaim deletion off (on = true) or back on
// for an admin, with a required reason. Errors as Resume's.
func (sv *Service) SetKillSwitch(ctx context.Context, c Caller, on bool, reason string) (breaker.State, error) {
	if err := sv.s.authorize(ctx, c, auth.RoleAdmin, "kill switch"); err != nil {
		return breaker.State{}, err
	}
	if strings.TrimSpace(reason) == "" {
		return breaker.State{}, badRequest("invalid request", "reason: required")
	}
	return sv.s.changeBreakers(ctx, func(st breaker.State) (breaker.State, breaker.Decision, error) {
		st, d := breaker.SetKillSwitch(st, on, c.actor(), reason, sv.s.cfg.Now())
		return st, d, nil
	})
}

// changeBreakers applies change to the stored breaker state compare-and-set,
// with its decision in the breaker audit, retrying when the controller
// evaluated meanwhile.
func (s *server) changeBreakers(ctx context.Context, change func(breaker.State) (breaker.State, breaker.Decision, error)) (breaker.State, error) {
	for attempt := 0; attempt < 5; attempt++ {
		st, v, err := s.loadBreakers(ctx)
		if err != nil {
			return breaker.State{}, err
		}
		st, d, err := change(st)
		if err != nil {
			return breaker.State{}, err
		}
		doc, err := json.Marshal(st)
		if err != nil {
			return breaker.State{}, fmt.Errorf("encode breaker state: %w", err)
		}
		ev, err := json.Marshal(d.Evidence)
		if err != nil {
			return breaker.State{}, fmt.Errorf("encode breaker evidence: %w", err)
		}
		err = s.cfg.Store.SaveBreakerState(ctx, doc, v, []store.BreakerDecision{{At: d.At, Scope: string(d.Scope),
			Cohort: d.Cohort, From: string(d.From), To: string(d.To), Cause: string(d.Cause), Actor: d.Actor,
			Message: d.Message, HaltRollout: d.HaltRollout, Evidence: ev}}, s.cfg.Now())
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			return breaker.State{}, err
		}
		return st, nil
	}
	return breaker.State{}, &Problem{Status: http.StatusConflict, Message: "breaker state kept changing", Detail: "retry"}
}

// pValue writes a p-value as a power of ten ("10^-4.3") below 0.001.
func pValue(p float64) string {
	if p >= 0.001 {
		return fmt.Sprintf("%.3g", p)
	}
	return fmt.Sprintf("10^%.1f", math.Log10(p))
}
