package api

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// shadow serves GET /api/v1/shadow?since=RFC3339[&until=RFC3339]: what the
// current policy would have done with the findings stored for [since,
// until) (docs/shadow.md). until defaults to now and is clamped to now (the
// future holds no findings). A malformed or empty range is a 400 naming the
// parameter; a range the report refuses (too long, too many findings) is a
// 400 with its reason.
//
// The report is the API's most expensive answer (it holds the range's
// findings in memory), so it needs an operator token of at least the viewer
// role (401/403, audited), the range is checked before anything is loaded,
// and at most Limits.ShadowConcurrent reports run at once, one per operator
// (else 429 with Retry-After).
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
	now := s.cfg.Now().UTC()
	since, until := time.Time{}, now
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
		} else if t.Before(now) {
			until = t
		}
	}
	if len(problems) == 0 && !since.Before(until) {
		problems = append(problems, fmt.Sprintf("since: %s must be before until %s (until defaults to now and is never later)",
			since.Format(time.RFC3339), until.Format(time.RFC3339)))
	}
	if len(problems) > 0 {
		writeError(w, http.StatusBadRequest, "invalid range", "", problems)
		return
	}
	release, ok := s.acquireShadow(w, op.Name)
	if !ok {
		return
	}
	defer release()
	rep, err := s.cfg.Shadow(r.Context(), since, until)
	switch {
	case errors.Is(err, store.ErrInvalid):
		writeError(w, http.StatusBadRequest, "invalid range", err.Error(), nil)
		return
	case err != nil && r.Context().Err() != nil:
		return // the client went away; nobody reads an answer
	case err != nil:
		s.writeStoreError(w, r, err)
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
