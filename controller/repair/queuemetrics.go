package repair

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
)

// queueMetrics is client-go's workqueue.MetricsProvider on the controller's
// own Prometheus registry, with the metric names and labels every
// Kubernetes controller exports (workqueue_depth{name}, workqueue_adds_total,
// workqueue_queue_duration_seconds, workqueue_work_duration_seconds,
// workqueue_unfinished_work_seconds,
// workqueue_longest_running_processor_seconds, workqueue_retries_total), so
// the usual dashboards and alerts apply.
type queueMetrics struct {
	depth, unfinished, longest *prometheus.GaugeVec
	adds, retries              *prometheus.CounterVec
	latency, work              *prometheus.HistogramVec
}

func newQueueMetrics(reg prometheus.Registerer) (*queueMetrics, error) {
	buckets := prometheus.ExponentialBuckets(10e-9, 10, 12) // 10ns .. 10^3 s, as client-go's own
	m := &queueMetrics{
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: "workqueue", Name: "depth",
			Help: "Current depth of the work queue."}, []string{"name"}),
		adds: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: "workqueue", Name: "adds_total",
			Help: "Adds handled by the work queue."}, []string{"name"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: "workqueue", Name: "queue_duration_seconds",
			Help: "Seconds an item waits in the work queue before it is requested.", Buckets: buckets}, []string{"name"}),
		work: prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: "workqueue", Name: "work_duration_seconds",
			Help: "Seconds processing an item from the work queue takes.", Buckets: buckets}, []string{"name"}),
		unfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: "workqueue", Name: "unfinished_work_seconds",
			Help: "Seconds of work in progress not yet observed by work_duration (large values: stuck workers)."}, []string{"name"}),
		longest: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: "workqueue", Name: "longest_running_processor_seconds",
			Help: "Seconds the longest-running worker has been processing its item."}, []string{"name"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: "workqueue", Name: "retries_total",
			Help: "Retries (rate-limited re-adds) handled by the work queue."}, []string{"name"}),
	}
	for _, c := range []prometheus.Collector{m.depth, m.adds, m.latency, m.work, m.unfinished, m.longest, m.retries} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register work queue metrics: %w", err)
		}
	}
	return m, nil
}

func (m *queueMetrics) NewDepthMetric(name string) workqueue.GaugeMetric {
	return m.depth.WithLabelValues(name)
}

func (m *queueMetrics) NewAddsMetric(name string) workqueue.CounterMetric {
	return m.adds.WithLabelValues(name)
}

func (m *queueMetrics) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return m.latency.WithLabelValues(name)
}

func (m *queueMetrics) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return m.work.WithLabelValues(name)
}

func (m *queueMetrics) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return m.unfinished.WithLabelValues(name)
}

func (m *queueMetrics) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return m.longest.WithLabelValues(name)
}

func (m *queueMetrics) NewRetriesMetric(name string) workqueue.CounterMetric {
	return m.retries.WithLabelValues(name)
}
