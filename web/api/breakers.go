package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/store"
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

func (s *server) loadBreakers(r *http.Request) (breaker.State, int64, error) {
	doc, v, err := s.cfg.Store.BreakerState(r.Context())
	if err != nil || doc == nil {
		return breaker.State{}, v, err
	}
	var st breaker.State
	if err := json.Unmarshal(doc, &st); err != nil {
		return breaker.State{}, v, fmt.Errorf("decode breaker state: %w", err)
	}
	return st, v, nil
}

func (s *server) getBreakers(w http.ResponseWriter, r *http.Request) {
	st, _, err := s.loadBreakers(r)
	if err != nil {
		s.writeStoreError(w, r, err)
		return
	}
	ds, err := s.cfg.Store.BreakerDecisions(r.Context(), 100)
	if err != nil {
		s.writeStoreError(w, r, err)
		return
	}
	out := BreakerView{State: st, Decisions: []BreakerDecision{}}
	for _, d := range ds {
		out.Decisions = append(out.Decisions, BreakerDecision{ID: d.ID, At: d.At.Format("2006-01-02T15:04:05Z07:00"), Scope: d.Scope,
			Cohort: d.Cohort, From: d.From, To: d.To, Cause: d.Cause, Actor: d.Actor, Message: d.Message, HaltRollout: d.HaltRollout, Evidence: d.Evidence})
	}
	writeJSON(w, http.StatusOK, out)
}

// breakerAction returns the handler of an admin breaker action: resume a
// cohort, or switch every repair off/on. The change is saved
// compare-and-set with its decision in the breaker audit.
func (s *server) breakerAction(kill bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		op, ok := s.operator(w, r, auth.RoleAdmin)
		if !ok {
			return
		}
		var req BreakerRequest
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, "malformed request", err.Error(), nil)
			return
		}
		var problems []string
		if strings.TrimSpace(req.Reason) == "" {
			problems = append(problems, "reason: required")
		}
		if kill && req.On == nil {
			problems = append(problems, "on: required (true stops every repair, false resumes them)")
		}
		if !kill && req.Cohort == "" {
			problems = append(problems, `cohort: required (e.g. "zone=us-east-1a", or "fleet")`)
		} else if !kill && req.Cohort != breaker.FleetScope {
			if _, err := breaker.ParseCohort(req.Cohort); err != nil {
				problems = append(problems, fmt.Sprintf("cohort: %v (want key=value, e.g. zone=us-east-1a, or %q)", err, breaker.FleetScope))
			}
		}
		if len(problems) > 0 {
			writeError(w, http.StatusBadRequest, "invalid request", "", problems)
			return
		}
		actor := "user:" + op.Name
		for attempt := 0; attempt < 5; attempt++ {
			st, v, err := s.loadBreakers(r)
			if err != nil {
				s.writeStoreError(w, r, err)
				return
			}
			var d breaker.Decision
			if kill {
				st, d = breaker.SetKillSwitch(st, *req.On, actor, req.Reason, s.cfg.Now())
			} else if st, d, err = breaker.Resume(st, req.Cohort, actor, req.Reason, s.cfg.Now()); err != nil {
				status := http.StatusBadRequest
				if errors.Is(err, breaker.ErrNotOpen) {
					status = http.StatusConflict
				}
				writeError(w, status, "cannot resume "+req.Cohort, err.Error(), nil)
				return
			}
			doc, err := json.Marshal(st)
			if err != nil {
				s.writeStoreError(w, r, err)
				return
			}
			ev, _ := json.Marshal(d.Evidence)
			err = s.cfg.Store.SaveBreakerState(r.Context(), doc, v, []store.BreakerDecision{{At: d.At, Scope: string(d.Scope),
				Cohort: d.Cohort, From: string(d.From), To: string(d.To), Cause: string(d.Cause), Actor: d.Actor,
				Message: d.Message, HaltRollout: d.HaltRollout, Evidence: ev}}, s.cfg.Now())
			if errors.Is(err, store.ErrConflict) {
				continue // the controller evaluated meanwhile: apply to the new state
			}
			if err != nil {
				s.writeStoreError(w, r, err)
				return
			}
			writeJSON(w, http.StatusOK, st)
			return
		}
		writeError(w, http.StatusConflict, "breaker state kept changing", "retry", nil)
	}
}
