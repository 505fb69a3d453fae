package api

import (
	"context"
	"net/http"
	"strconv"
	"time"
)

func (s *server) listNodes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	nq := NodeQuery{Cluster: q.Get("cluster"), NodePool: q.Get("nodepool"), Zone: q.Get("zone"), Search: q.Get("q"),
		Health: q.Get("health"), Cursor: q.Get("cursor")}
	if v := q.Get("includeRemoved"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			s.writeErr(w, r, badRequest("invalid query", "includeRemoved: "+strconv.Quote(v)+" is not true or false"))
			return
		}
		nq.IncludeRemoved = b
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 {
			n = -1 // Nodes names the valid range
		}
		nq.Limit = n
	}
	out, err := (&Service{s: s}).Nodes(r.Context(), nq)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) getFleet(w http.ResponseWriter, r *http.Request) {
	out, err := (&Service{s: s}).Fleet(r.Context())
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) getApprovals(w http.ResponseWriter, r *http.Request) {
	out, err := (&Service{s: s}).Approvals(r.Context())
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// Stats is the body of GET /api/v1/stats?days=N (default 30, at most 366):
// repairs opened per day by reason and time to replacement.
type Stats struct {
	// Days are the UTC days of the range, oldest first (YYYY-MM-DD).
	Days    []string      `json:"days"`
	Reasons []ReasonStats `json:"reasons"`
	// BreakerTrips are the breaker trips (decisions into open) per day,
	// one series per scope: "cohort zone", "cohort instance-type", "fleet",
	// "kill-switch", ...
	BreakerTrips []TripStats `json:"breakerTrips"`
}

// TripStats is one breaker scope's trips: PerDay[i] on Days[i].
type TripStats struct {
	Scope  string `json:"scope"`
	PerDay []int  `json:"perDay"`
}

// ReasonStats is one reason's repairs in the range: PerDay[i] opened on
// Days[i]; of those replaced, the time from opening to the replacement Ready
// (p50, p90, seconds).
type ReasonStats struct {
	Reason     string  `json:"reason"`
	PerDay     []int   `json:"perDay"`
	Replaced   int     `json:"replaced"`
	P50Seconds float64 `json:"p50Seconds"`
	P90Seconds float64 `json:"p90Seconds"`
}

// Stats returns the repair statistics of the days days up to today (UTC).
// Errors: a 400 Problem for days outside 1..366, or a store error.
func (sv *Service) Stats(ctx context.Context, days int) (Stats, error) {
	if days < 1 || days > 366 {
		return Stats{}, badRequest("invalid query", "days: must be 1..366")
	}
	now := sv.s.cfg.Now().UTC()
	rs, err := sv.s.cfg.Store.RepairStats(ctx, days, now)
	if err != nil {
		return Stats{}, err
	}
	trips, err := sv.s.cfg.Store.BreakerTripStats(ctx, days, now)
	if err != nil {
		return Stats{}, err
	}
	out := Stats{Reasons: make([]ReasonStats, 0, len(rs)), BreakerTrips: make([]TripStats, 0, len(trips))}
	for _, t := range trips {
		out.BreakerTrips = append(out.BreakerTrips, TripStats{Scope: t.Scope, PerDay: t.PerDay})
	}
	first := now.Truncate(24*time.Hour).AddDate(0, 0, -(days - 1))
	for i := range days {
		out.Days = append(out.Days, first.AddDate(0, 0, i).Format("2006-01-02"))
	}
	for _, r := range rs {
		out.Reasons = append(out.Reasons, ReasonStats{Reason: r.Reason, PerDay: r.PerDay, Replaced: r.Replaced, P50Seconds: r.P50, P90Seconds: r.P90})
	}
	return out, nil
}

func (s *server) getStats(w http.ResponseWriter, r *http.Request) {
	days := 30
	if d := r.URL.Query().Get("days"); d != "" {
		n, err := strconv.Atoi(d)
		if err != nil {
			n = -1
		}
		days = n
	}
	out, err := (&Service{s: s}).Stats(r.Context(), days)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
