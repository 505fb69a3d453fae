package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// DecisionRequest is the body of POST /api/v1/repairs/{id}/approve|reject.
type DecisionRequest struct {
	// Reason is required: why the on-call approves or rejects.
	Reason string `json:"reason"`
}

// operator authenticates the caller as a human with at least role want,
// answering 401/403 (audited) when not.
func (s *server) operator(w http.ResponseWriter, r *http.Request, want auth.Role) (auth.Operator, bool) {
	op, err := s.cfg.Operators.Authenticate(bearer(r))
	if err == nil && !op.Role.Allows(want) {
		err = fmt.Errorf("operator %s has role %s, %s needs %s: %w", op.Name, op.Role, r.URL.Path, want, auth.ErrForbidden)
	}
	if err != nil {
		status := http.StatusUnauthorized
		if errors.Is(err, auth.ErrForbidden) {
			status = http.StatusForbidden
		}
		s.audit(r.Context(), store.SecurityEvent{Subject: op.Name, Action: r.Method + " " + r.URL.Path,
			Outcome: "denied", Status: status, Reason: err.Error(), RemoteAddr: r.RemoteAddr})
		writeError(w, status, "operator not allowed", err.Error(), nil)
		return auth.Operator{}, false
	}
	return op, true
}

// decide returns the handler moving an awaiting_approval repair to to
// (approved or rejected). An approval does not delete anything by itself:
// the reconciler re-validates the repair (node still unhealthy, NodeClaim
// UID unchanged) and takes it through the budgets and breakers like any
// other deletion.
func (s *server) decide(to ledger.State) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		op, ok := s.operator(w, r, auth.RoleApprover)
		if !ok {
			return
		}
		id, err := strconv.ParseInt(chi.URLParam(r, "id"), 10, 64)
		if err != nil || id <= 0 {
			writeError(w, http.StatusBadRequest, "invalid repair id", chi.URLParam(r, "id"), nil)
			return
		}
		var req DecisionRequest
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, "malformed decision", err.Error()+` (want {"reason": "..."})`, nil)
			return
		}
		if strings.TrimSpace(req.Reason) == "" {
			writeError(w, http.StatusBadRequest, "invalid decision", "", []string{"reason: required (why you " + verb(to) + " this repair)"})
			return
		}
		rp, err := s.cfg.Store.Transition(r.Context(), store.TransitionRequest{ID: id, From: ledger.AwaitingApproval, To: to,
			Actor: "user:" + op.Name, Reason: req.Reason, Detail: map[string]any{"role": string(op.Role)}}, s.cfg.Now())
		if errors.Is(err, store.ErrConflict) {
			cur, gerr := s.cfg.Store.GetRepair(r.Context(), id)
			detail := "the repair is no longer awaiting approval"
			if gerr == nil {
				detail = fmt.Sprintf("the repair is %s, not awaiting_approval", cur.State)
			}
			writeError(w, http.StatusConflict, "cannot "+verb(to)+" this repair", detail, nil)
			return
		}
		if err != nil {
			s.writeStoreError(w, r, err)
			return
		}
		if s.cfg.OnIngest != nil {
			s.cfg.OnIngest(rp.Cluster, rp.Node) // let the reconciler act on the decision now
		}
		writeJSON(w, http.StatusOK, toRepair(rp))
	}
}

func verb(to ledger.State) string {
	if to == ledger.Approved {
		return "approve"
	}
	return "reject"
}
