package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

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

// readsNeedViewer reports whether reads need at least a viewer: operators
// or a login are configured (docs/dashboard.md, "Login and roles").
func (s *server) readsNeedViewer() bool { return s.cfg.Operators != nil || s.cfg.Login }

// requireViewer lets a read through only for a viewer or above (a bearer
// operator token, or a dashboard login session) when readsNeedViewer;
// otherwise 401/403, audited like every denial. Without operators and a
// login, reads stay open (a demo or a test without auth).
func (s *server) requireViewer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.readsNeedViewer() {
			if _, ok := s.operator(w, r, auth.RoleViewer); !ok {
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// operator authenticates the caller as a human with at least role want,
// answering 401/403 (audited) when not.
func (s *server) operator(w http.ResponseWriter, r *http.Request, want auth.Role) (auth.Operator, bool) {
	if op, ok := auth.OperatorFrom(r.Context()); ok && bearer(r) == "" {
		// A dashboard login session (web/ui); the Service checks its role.
		return op, true
	}
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

// decide returns the handler of POST /api/v1/repairs/{id}/approve|reject:
// Service.Decide for the authenticated operator.
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
		rp, err := (&Service{s: s}).Decide(r.Context(), s.caller(r, op), id, to, req.Reason)
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, rp)
	}
}

func (s *server) caller(r *http.Request, op auth.Operator) Caller {
	via := "api"
	if bearer(r) == "" {
		via = "dashboard"
	}
	return Caller{Operator: op, Via: via, RemoteAddr: r.RemoteAddr}
}

func verb(to ledger.State) string {
	if to == ledger.Approved {
		return "approve"
	}
	return "reject"
}
