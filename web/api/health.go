package api

import (
	"fmt"
	"net/http"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// Node health values.
const (
	HealthOK      = "ok"
	HealthFailing = "failing"
	HealthUnknown = "unknown"
)

// ClusterState is what the controller last saw of a cluster's API server:
// reachable or not since when, the last error, and (with leader election)
// whether this replica leads it. The composition root maps the
// reconciler's view into it (Config.ClusterStates).
type ClusterState struct {
	Name      string    `json:"name"`
	Reachable bool      `json:"reachable"`
	Since     time.Time `json:"since"` // when Reachable last changed
	LastError string    `json:"lastError,omitempty"`
	Leading   *bool     `json:"leading,omitempty"` // nil: leader election off
}

func (s *server) clusterState(name string) (ClusterState, bool) {
	if s.cfg.ClusterStates == nil {
		return ClusterState{Name: name, Reachable: true}, true
	}
	for _, c := range s.cfg.ClusterStates() {
		if c.Name == name {
			return c, true
		}
	}
	return ClusterState{}, false
}

// health derives a node's health: unknown when its cluster's API server is
// unreachable, its agent never reported or went silent, or a monitor is
// unknown with no fault on record; failing with an active condition
// diagnosis; else ok.
func (s *server) health(n store.Node, ds []store.DiagnosisRecord) (string, string) {
	if c, ok := s.clusterState(n.Cluster); !ok || !c.Reachable {
		return HealthUnknown, "the cluster's API server is unreachable: " + c.LastError
	}
	for _, d := range ds {
		if d.Active && d.Severity == "condition" {
			return HealthFailing, d.Reason
		}
	}
	if n.Removed() {
		return HealthUnknown, fmt.Sprintf("Node removed from the cluster at %s (history kept)", n.RemovedAt.Format(time.RFC3339))
	}
	stale := s.cfg.StaleAfter
	if stale <= 0 {
		stale = 90 * time.Second
	}
	switch {
	case n.LastSeen.IsZero():
		return HealthUnknown, "no report from a fleetrepair agent yet"
	case s.cfg.Now().Sub(n.LastSeen) > stale:
		return HealthUnknown, fmt.Sprintf("agent silent since %s", n.LastSeen.Format(time.RFC3339))
	}
	if n.Heartbeat != nil {
		for _, m := range n.Heartbeat.Monitors {
			if m.State == finding.StateUnknown {
				return HealthUnknown, fmt.Sprintf("monitor %s unknown: %s", m.Name, m.Reason)
			}
		}
	}
	return HealthOK, "no active fault"
}

// ClusterList is the body of GET /api/v1/clusters.
type ClusterList struct {
	Items []ClusterState `json:"items"`
}

func (s *server) listClusters(w http.ResponseWriter, _ *http.Request) {
	out := ClusterList{Items: []ClusterState{}}
	if s.cfg.ClusterStates != nil {
		out.Items = append(out.Items, s.cfg.ClusterStates()...)
	} else {
		for _, c := range s.cfg.Clusters {
			out.Items = append(out.Items, ClusterState{Name: c, Reachable: true})
		}
	}
	writeJSON(w, http.StatusOK, out)
}
