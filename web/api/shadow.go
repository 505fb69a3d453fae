package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// ShadowLimits are the shadow report's cost limits, as an SRE reads them
// before asking for one: the longest range, the most findings one report
// replays (range plus lookback; more is refused, not truncated), the
// lookback read before since, how many reports run at once on a replica,
// and that one operator runs one at a time. cmd/runner sets the report's
// own (controller/shadow Config.Limits); zero fields are unknown.
type ShadowLimits struct {
	MaxRangeSeconds float64 `json:"maxRangeSeconds"`
	MaxFindings     int     `json:"maxFindings"`
	LookbackSeconds float64 `json:"lookbackSeconds"`
	Concurrent      int     `json:"concurrent"`
	PerOperator     int     `json:"perOperator"`
}

// ShadowLimits returns the shadow report's cost limits (ShadowLimits).
func (sv *Service) ShadowLimits() ShadowLimits {
	l := sv.s.cfg.ShadowLimits
	l.Concurrent, l.PerOperator = cap(sv.s.guards.shadow), 1
	return l
}

// Shadow computes the shadow report for [since, until) for a viewer or
// above: what the current policy would have done with the stored findings
// (docs/shadow.md). until is clamped to now; at most
// ShadowLimits.Concurrent reports run at once, one per operator. It returns
// the report (controller/shadow's *Report) or a Problem: 400 for a bad
// range (the report's own refusals included: too long, too many findings),
// 403, 429 (busy, with RetryAfter), 501 without the report; or a store
// error.
func (sv *Service) Shadow(ctx context.Context, c Caller, since, until time.Time) (any, error) {
	s := sv.s
	if s.cfg.Shadow == nil {
		return nil, &Problem{Status: http.StatusNotImplemented, Message: "shadow report not available",
			Detail: "this controller was started without the shadow report"}
	}
	if err := s.authorize(ctx, c, auth.RoleViewer, "shadow report"); err != nil {
		return nil, err
	}
	now := s.cfg.Now().UTC()
	since, until = since.UTC(), until.UTC()
	if until.IsZero() || until.After(now) {
		until = now
	}
	if since.IsZero() {
		return nil, badRequest("invalid range", "since: required: an RFC 3339 time, e.g. 2026-11-23T12:00:00Z (the CLI converts durations such as 168h)")
	}
	if !since.Before(until) {
		return nil, badRequest("invalid range", fmt.Sprintf("since: %s must be before until %s (until defaults to now and is never later)",
			since.Format(time.RFC3339), until.Format(time.RFC3339)))
	}
	release, err := s.acquireShadow(c.Operator.Name)
	if err != nil {
		return nil, err
	}
	defer release()
	rep, err := s.cfg.Shadow(ctx, since, until)
	if errors.Is(err, store.ErrInvalid) {
		return nil, &Problem{Status: http.StatusBadRequest, Message: "invalid range", Detail: err.Error()}
	}
	return rep, err
}

// shadow serves GET /api/v1/shadow?since=RFC3339[&until=RFC3339]:
// Service.Shadow for the operator of the bearer token (or login session).
// A malformed time is a 400 naming the parameter.
//
// The report is the API's most expensive answer (it holds the range's
// findings in memory), so it needs at least the viewer role even when
// reads are otherwise open (401/403, audited), the range is checked before
// anything is loaded, and at most Limits.ShadowConcurrent reports run at
// once, one per operator (else 429 with Retry-After).
func (s *server) shadow(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Shadow == nil {
		writeError(w, http.StatusNotImplemented, "shadow report not available",
			"this controller was started without the shadow report", nil)
		return
	}
	op, ok := s.operator(w, r, auth.RoleViewer)
	if !ok {
		return
	}
	q := r.URL.Query()
	var since, until time.Time
	var problems []string
	if v := q.Get("since"); v == "" {
		problems = append(problems, "since: required: an RFC 3339 time, e.g. 2026-11-23T12:00:00Z (the CLI converts durations such as 168h)")
	} else if t, err := parseRangeTime(v); err != nil {
		problems = append(problems, "since: "+err.Error())
	} else {
		since = t
	}
	if v := q.Get("until"); v != "" {
		t, err := parseRangeTime(v)
		if err != nil {
			problems = append(problems, "until: "+err.Error())
		} else {
			until = t
		}
	}
	if len(problems) > 0 {
		writeError(w, http.StatusBadRequest, "invalid range", "", problems)
		return
	}
	rep, err := (&Service{s: s}).Shadow(r.Context(), Caller{Operator: op, Via: "api", RemoteAddr: r.RemoteAddr}, since, until)
	switch {
	case err != nil && r.Context().Err() != nil:
		return // the client went away; nobody reads an answer
	case err != nil:
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// parseRangeTime reads an RFC 3339 time; a duration gets a hint, since the
// CLI takes one and a hand-written URL easily carries it.
func parseRangeTime(v string) (time.Time, error) {
	t, err := parseTime(v)
	if err == nil {
		return t.UTC(), nil
	}
	if _, derr := time.ParseDuration(v); derr == nil {
		return time.Time{}, fmt.Errorf("%q is a duration: the API takes an RFC 3339 time (`fleetrepair shadow --since %s` converts it)", v, v)
	}
	return time.Time{}, err
}
