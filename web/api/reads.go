package api

import (
	"net/http"
	"strconv"
)

func (s *server) listNodes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	nq := NodeQuery{Cluster: q.Get("cluster"), NodePool: q.Get("nodepool"), Zone: q.Get("zone"), Search: q.Get("q"),
		Health: q.Get("health"), Cursor: q.Get("cursor")}
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
