package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/breaker"
)

// BreakerView is the body of GET /api/v1/breakers: the current state (open
// cohort breakers with their evidence, the fleet ceiling, the kill switch)
// and the newest decisions.
type BreakerView struct {
	State     breaker.State     `json:"state"`
	Decisions []BreakerDecision `json:"decisions"`
}

// BreakerDecision is one audited breaker change.
type BreakerDecision struct {
	ID          int64           `json:"id"`
	At          string          `json:"at"`
	Scope       string          `json:"scope"`
	Cohort      string          `json:"cohort,omitempty"`
	From        string          `json:"from"`
	To          string          `json:"to"`
	Cause       string          `json:"cause"`
	Actor       string          `json:"actor"`
	Message     string          `json:"message"`
	HaltRollout bool            `json:"haltRollout,omitempty"`
	Evidence    json.RawMessage `json:"evidence"`
}

// BreakerRequest is the body of the admin breaker actions.
type BreakerRequest struct {
	// Cohort to resume ("zone=us-east-1a", or "fleet" for the ceiling).
	Cohort string `json:"cohort,omitempty"`
	// On switches every repair off (true) or back on (false); kill-switch only.
	On *bool `json:"on,omitempty"`
	// Reason is required and audited.
	Reason string `json:"reason"`
}

func (s *server) loadBreakers(ctx context.Context) (breaker.State, int64, error) {
	doc, v, err := s.cfg.Store.BreakerState(ctx)
	if err != nil || doc == nil {
		return breaker.State{}, v, err
	}
	var st breaker.State
	if err := json.Unmarshal(doc, &st); err != nil {
		return breaker.State{}, v, fmt.Errorf("decode breaker state: %w", err)
	}
	return st, v, nil
}

// Breakers returns the breaker state and the newest 100 decisions (GET /api/v1/breakers).
func (sv *Service) Breakers(ctx context.Context) (BreakerView, error) {
	st, _, err := sv.s.loadBreakers(ctx)
	if err != nil {
		return BreakerView{}, err
	}
	ds, err := sv.s.cfg.Store.BreakerDecisions(ctx, 100)
	if err != nil {
		return BreakerView{}, err
	}
	out := BreakerView{State: st, Decisions: []BreakerDecision{}}
	for _, d := range ds {
		out.Decisions = append(out.Decisions, BreakerDecision{ID: d.ID, At: d.At.Format("2006-01-02T15:04:05Z07:00"), Scope: d.Scope,
			Cohort: d.Cohort, From: d.From, To: d.To, Cause: d.Cause, Actor: d.Actor, Message: d.Message, HaltRollout: d.HaltRollout, Evidence: d.Evidence})
	}
	return out, nil
}

func (s *server) getBreakers(w http.ResponseWriter, r *http.Request) {
	out, err := (&Service{s: s}).Breakers(r.Context())
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// breakerAction returns the handler of an admin breaker action: resume a
// cohort (Service.Resume), or switch every repair off/on
// (Service.SetKillSwitch).
func (s *server) breakerAction(kill bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		op, ok := s.operator(w, r, auth.RoleAdmin)
		if !ok {
			return
		}
		var req BreakerRequest
		if err := decodeStrict(w, r, MaxCommandBytes, &req); err != nil {
			if limit, ok := tooLarge(err); ok {
				writeError(w, http.StatusRequestEntityTooLarge, "request too large", fmt.Sprintf("the body is over %d bytes", limit), nil)
				return
			}
			writeError(w, http.StatusBadRequest, "malformed request", err.Error(), nil)
			return
		}
		sv := &Service{s: s}
		var (
			st  breaker.State
			err error
		)
		switch {
		case kill && req.On == nil:
			err = badRequest("invalid request", "on: required (true stops every repair, false resumes them)")
		case kill:
			st, err = sv.SetKillSwitch(r.Context(), s.caller(r, op), *req.On, req.Reason)
		default:
			st, err = sv.Resume(r.Context(), s.caller(r, op), req.Cohort, req.Reason)
		}
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, st)
	}
}
