package api

import (
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/fleetrepair/fleetrepair/controller/lifecycle"
)

// NodeClaimList is the body of GET /api/v1/clusters/{cluster}/nodeclaims:
// the cluster's Karpenter NodeClaims as the controller's last periodic pass
// classified them (controller/lifecycle: Karpenter's lifecycle is not
// health; none of these states is ever repaired), stuck ones first.
type NodeClaimList struct {
	Cluster string `json:"cluster"`
	// EvaluatedAt is when the pass listed the cluster.
	EvaluatedAt time.Time `json:"evaluatedAt"`
	// Counts are the cluster's NodeClaims by state, every state present.
	Counts map[lifecycle.State]int `json:"counts"`
	// Items are the NodeClaims matching ?state=.
	Items []lifecycle.Claim `json:"items"`
}

// MaxFleetStuckClaims bounds the stuck NodeClaims the fleet summary lists
// per cluster (the count is always complete).
const MaxFleetStuckClaims = 20

// nodeClaimStates answers the NodeClaims of a cluster as the last pass
// classified them: claims, when, false when no pass listed it yet.
func (s *server) nodeClaimStates(cluster string) ([]lifecycle.Claim, time.Time, bool) {
	if s.cfg.NodeClaims == nil {
		return nil, time.Time{}, false
	}
	return s.cfg.NodeClaims(cluster)
}

// getNodeClaims serves GET /api/v1/clusters/{cluster}/nodeclaims
// [?state=stuck|all|<state>[,<state>...]] (default all). 404 for a cluster
// this controller does not serve; 503 when no pass has listed it yet
// (starting, or its API server unreachable since the start).
func (s *server) getNodeClaims(w http.ResponseWriter, r *http.Request) {
	cluster := chi.URLParam(r, "cluster")
	if !s.serves(cluster) {
		writeError(w, http.StatusNotFound, "no such cluster", cluster+" is not served by this controller (GET /api/v1/clusters)", nil)
		return
	}
	want, problems := parseClaimStates(r.URL.Query().Get("state"))
	if len(problems) > 0 {
		writeError(w, http.StatusBadRequest, "invalid query", "", problems)
		return
	}
	claims, at, ok := s.nodeClaimStates(cluster)
	if !ok {
		writeError(w, http.StatusServiceUnavailable, "nodeclaims not listed yet",
			"the controller's periodic pass has not listed this cluster's NodeClaims yet (starting, or its API server is unreachable: GET /api/v1/clusters)", nil)
		return
	}
	writeJSON(w, http.StatusOK, nodeClaimList(cluster, claims, at, want))
}

// nodeClaimList builds the list of one cluster's claims matching want (nil:
// all).
func nodeClaimList(cluster string, claims []lifecycle.Claim, at time.Time, want func(lifecycle.Claim) bool) NodeClaimList {
	out := NodeClaimList{Cluster: cluster, EvaluatedAt: at, Counts: map[lifecycle.State]int{}, Items: []lifecycle.Claim{}}
	for _, st := range lifecycle.States() {
		out.Counts[st] = 0
	}
	for _, c := range claims {
		out.Counts[c.State]++
		if want == nil || want(c) {
			out.Items = append(out.Items, c)
		}
	}
	return out
}

// parseClaimStates reads ?state=: "" or "all" (every claim), "stuck"
// (lifecycle.State.Stuck), or a comma-separated list of states.
func parseClaimStates(q string) (func(lifecycle.Claim) bool, []string) {
	switch q {
	case "", "all":
		return nil, nil
	case "stuck":
		return func(c lifecycle.Claim) bool { return c.Stuck }, nil
	}
	var want []lifecycle.State
	var problems []string
	for _, v := range strings.Split(q, ",") {
		st := lifecycle.State(strings.TrimSpace(v))
		if !slices.Contains(lifecycle.States(), st) {
			names := []string{"all", "stuck"}
			for _, s := range lifecycle.States() {
				names = append(names, string(s))
			}
			problems = append(problems, "state: "+string(st)+" is not one of "+strings.Join(names, ", "))
			continue
		}
		want = append(want, st)
	}
	return func(c lifecycle.Claim) bool { return slices.Contains(want, c.State) }, problems
}
