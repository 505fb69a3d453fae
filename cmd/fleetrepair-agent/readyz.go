package main

import (
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// lastSuccessMetric is the uplink's gauge of the last report the controller
// accepted (agent/uplink/metrics.go), in Unix seconds; 0 before the first.
const lastSuccessMetric = "fleetrepair_agent_uplink_last_success_timestamp_seconds"

// readyz answers /readyz: 200 when the controller accepted a report within
// `within`, else 503 saying since when it has not (the DaemonSet's readiness
// probe, so a rollout of agents that cannot report stops).
type readyz struct {
	reg    prometheus.Gatherer
	within time.Duration
	now    func() time.Time
}

func (h readyz) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	last, err := h.lastSuccess()
	switch {
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	case last.IsZero():
		http.Error(w, "not ready: the controller has not accepted a report from this agent yet", http.StatusServiceUnavailable)
	case h.now().Sub(last) > h.within:
		http.Error(w, fmt.Sprintf("not ready: the controller last accepted a report %s ago (at %s), more than %s",
			h.now().Sub(last).Round(time.Second), last.UTC().Format(time.RFC3339), h.within), http.StatusServiceUnavailable)
	default:
		_, _ = w.Write([]byte("ok\n"))
	}
}

// lastSuccess reads the uplink's last-success gauge; zero when it is 0 or
// not registered.
func (h readyz) lastSuccess() (time.Time, error) {
	mfs, err := h.reg.Gather()
	if err != nil {
		return time.Time{}, fmt.Errorf("gather metrics: %w", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != lastSuccessMetric || len(mf.GetMetric()) == 0 {
			continue
		}
		if v := mf.GetMetric()[0].GetGauge().GetValue(); v > 0 {
			return time.Unix(0, int64(v*1e9)), nil
		}
	}
	return time.Time{}, nil
}
