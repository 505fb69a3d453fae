package uplink

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Send error classes, the values of the "reason" label of
// fleetrepair_agent_uplink_send_errors_total.
const (
	errNetwork = "network"    // connection failed, timed out or broke mid-way
	errToken   = "token"      // TokenFile could not be read
	err5xx     = "http_5xx"   // the controller failed
	err429     = "http_429"   // the controller sheds load
	err408     = "http_408"   // the controller timed out reading the request
	errAuth    = "http_auth"  // 401 or 403
	errOther   = "http_other" // 1xx or an unfollowed 3xx
)

// Metrics is one set of the uplink's metrics (fleetrepair_agent_uplink_*).
// An Uplink builds its own unless Config.Metrics gives it one built by
// NewMetrics: a process that runs many uplinks (the load harness, test/load,
// one per simulated node) builds the 13 collectors once instead of once per
// uplink. Shared by several uplinks, the counters add up over them,
// queue_length and spool_findings are sums over them, and
// last_success_timestamp_seconds is the latest accepted report of any.
// Safe for concurrent use.
type Metrics struct {
	m *metrics
}

// NewMetrics builds a Metrics set and registers it on reg when reg is not
// nil. It returns an error when a collector of the same name is already
// registered on reg (nothing is left registered then).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := newMetrics()
	if reg != nil {
		if err := m.register(reg); err != nil {
			return nil, err
		}
	}
	return &Metrics{m: m}, nil
}

type metrics struct {
	queueLength  prometheus.Gauge
	enqueued     prometheus.Counter
	sentFindings prometheus.Counter
	sentReports  prometheus.Counter
	sendErrors   *prometheus.CounterVec
	retries      prometheus.Counter
	dropped      *prometheus.CounterVec
	rejected     prometheus.Counter
	lastSuccess  prometheus.Gauge
	spooled      prometheus.Gauge

	// Enqueue's drop counters, resolved once: no label lookup on the hot path.
	dropQueueFull, dropQueueFullCritical prometheus.Counter
}

// newMetrics builds the collectors. queue_length is a plain gauge that the
// queue itself moves on every push and take (memQueue.length), so one set can
// sum the queues of many uplinks.
func newMetrics() *metrics {
	const ns, sub = "fleetrepair_agent", "uplink"
	m := &metrics{
		queueLength: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "queue_length",
			Help: "Findings waiting in the uplink queue (the batch in flight excluded).",
		}),
		enqueued: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "enqueued_findings_total",
			Help: "Findings handed to the uplink.",
		}),
		sentFindings: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "sent_findings_total",
			Help: "Findings in reports the controller accepted.",
		}),
		sentReports: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "sent_reports_total",
			Help: "Reports the controller accepted, heartbeat-only reports included.",
		}),
		sendErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "send_errors_total",
			Help: "Report attempts that failed and will be retried, by reason.",
		}, []string{"reason"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "retries_total",
			Help: "Backoff waits before resending the same batch.",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "dropped_total",
			Help: "Findings that will never be delivered, by reason.",
		}, []string{"reason"}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "rejected_total",
			Help: "Reports the controller rejected as malformed (4xx); their findings are counted in dropped_total{reason=\"rejected\"}.",
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "last_success_timestamp_seconds",
			Help: "Unix time of the last report the controller accepted; 0 before the first.",
		}),
		spooled: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "spool_findings",
			Help: "Findings in the on-disk spool file (0 without a spool, or when all were delivered).",
		}),
	}
	// Create every label value up front so that rate() and alerts see 0, not
	// absence, before the first drop.
	for _, r := range []string{DropQueueFull, DropQueueFullCritical, DropRejected, DropInvalid, DropShutdown, DropSpoolCorrupt} {
		m.dropped.WithLabelValues(r)
	}
	for _, r := range []string{errNetwork, errToken, err5xx, err429, err408, errAuth, errOther} {
		m.sendErrors.WithLabelValues(r)
	}
	m.dropQueueFull = m.dropped.WithLabelValues(DropQueueFull)
	m.dropQueueFullCritical = m.dropped.WithLabelValues(DropQueueFullCritical)
	return m
}

// register registers every metric on reg, or none of them.
func (m *metrics) register(reg prometheus.Registerer) error {
	cs := []prometheus.Collector{m.queueLength, m.enqueued, m.sentFindings, m.sentReports,
		m.sendErrors, m.retries, m.dropped, m.rejected, m.lastSuccess, m.spooled}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return fmt.Errorf("register uplink metrics: %w", err)
		}
	}
	return nil
}
