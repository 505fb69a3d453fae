package uplink

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// ReportsPath is appended to Config.URL to form the ingest endpoint.
const ReportsPath = "/api/v1/reports"

// Defaults applied by New to zero Config fields.
const (
	DefaultBatchSize            = 100
	DefaultFlushInterval        = 5 * time.Second
	DefaultQueueSize            = 10000
	DefaultHeartbeatInterval    = 30 * time.Second
	DefaultRequestTimeout       = 10 * time.Second
	DefaultRetryInitialInterval = 1 * time.Second
	DefaultRetryMaxInterval     = 30 * time.Second
	DefaultShutdownTimeout      = 3 * time.Second
	DefaultSpoolMaxBytes        = 32 << 20
)

// Clock is the time source of the sender: report times, flush and heartbeat
// deadlines and retry waits. k8s.io/utils/clock.RealClock (the default) and
// k8s.io/utils/clock/testing.FakeClock satisfy it.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) clock.Timer
}

// Config configures an Uplink. Zero values take the documented defaults; New
// rejects values that cannot work.
type Config struct {
	// URL is the controller's base URL (http or https, no query); reports are
	// POSTed to URL+ReportsPath. Required.
	URL string
	// Cluster is the name the controller knows this cluster by. Required.
	Cluster string
	// Node is the Kubernetes Node name the agent runs on. Required.
	Node string
	// BootID is the kernel boot ID (/proc/sys/kernel/random/boot_id).
	BootID string
	// AgentVersion is reported in every Report and in the User-Agent header.
	AgentVersion string

	// Token, when set, is sent as "Authorization: Bearer <Token>".
	Token string
	// TokenFile, when set, is read before every request and its trimmed
	// content sent as the bearer token, so that kubelet's rotation of a
	// projected ServiceAccount token is picked up. Exclusive with Token.
	TokenFile string

	// HTTPClient sends the reports. Default: a client on a clone of
	// http.DefaultTransport (trusting CAFile when set). Each attempt is
	// also bounded by RequestTimeout.
	HTTPClient *http.Client
	// CAFile, when set, is a PEM bundle of the certificate authorities the
	// controller's HTTPS certificate must chain to (instead of the system
	// roots), e.g. a cert-manager CA mounted from a Secret. It is read once
	// at start; with HTTPClient set it is an error.
	CAFile string
	// RequestTimeout bounds one POST, response included. Default 10s.
	RequestTimeout time.Duration

	// BatchSize is the most findings per Report, 1..finding.MaxFindingsPerReport.
	// A full batch is sent at once. Default 100.
	BatchSize int
	// FlushInterval is the longest a non-critical finding (or a changed
	// heartbeat) waits before it is sent. Default 5s.
	FlushInterval time.Duration
	// QueueSize bounds the in-memory queue, in findings (the batch in flight
	// is not counted). Default 10000.
	QueueSize int
	// HeartbeatInterval is the longest time between two reports; an
	// empty-findings report is a heartbeat. Must be >= FlushInterval, because
	// heartbeats are sent on the flush grid. Default 30s.
	HeartbeatInterval time.Duration

	// RetryInitialInterval is the first retry wait before jitter. Default 1s.
	RetryInitialInterval time.Duration
	// RetryMaxInterval caps every retry wait, jitter and Retry-After
	// included. Default 30s.
	RetryMaxInterval time.Duration
	// ShutdownTimeout bounds the last flush Run makes after its context ends.
	// Default 3s.
	ShutdownTimeout time.Duration

	// SpoolDir, when set, is a directory (created 0700; on a node, a hostPath
	// that outlives the agent's pod) where undelivered findings are kept
	// across agent restarts: see the package doc. Empty: no spool, findings
	// undelivered at exit are lost and counted.
	SpoolDir string
	// SpoolMaxBytes bounds the spool file, in bytes. Default 32 MiB.
	SpoolMaxBytes int64

	// Critical reports whether a finding is sent at once instead of waiting
	// for the next flush point, and whether it is kept when the queue is full.
	// It runs on the caller's goroutine in Enqueue and must be cheap.
	// Default DefaultCritical.
	Critical func(finding.Finding) bool

	// Logger receives the uplink's logs. Default slog.Default().
	Logger *slog.Logger
	// Registerer, when set, gets the uplink's metrics (fleetrepair_agent_uplink_*).
	Registerer prometheus.Registerer
	// Metrics, when set, is a metric set built once by NewMetrics (and
	// registered there) that this uplink counts on instead of building its
	// own; Registerer must then be nil. For processes running many uplinks.
	Metrics *Metrics
	// Clock is the time source. Default clock.RealClock{}.
	Clock Clock
	// Rand returns a pseudo-random number in [0, 1) for jitter. Default
	// math/rand/v2.Float64.
	Rand func() float64
}

// criticalXid reports whether Xid x's default action in the case corpus
// (shared/cases/xid-actions.md) is a node action: GPU reset, reboot or
// replacement. Criticality only decides latency and who survives a full queue;
// the controller alone decides what a finding means (docs/design.md, decision 1).
// Erring towards critical costs one extra request per event.
func criticalXid(x int) bool {
	switch x {
	case 46, 48, 54, 62, 64, 79, 95, 109, 110, 119, 120, 136, 140, 143, 151, 155, 156:
		return true
	}
	return false
}

// DefaultCritical is the default Config.Critical. It returns true for a GPU
// that is gone or failed to come up (fallen-off-bus, gpu-count,
// rminit-failed), a fatal PCIe AER error, an Xid whose default action is a GPU
// reset, reboot or replacement (48 DBE, 79 fallen off the bus, 95
// uncontained ECC, 119/120 GSP, ... see criticalXid), and Xid 154 unless its
// recovery action is "none". Secondary Xids (attr secondary=true, e.g. Xid 45
// cleanup) are never critical: the Xid that caused them is.
func DefaultCritical(f finding.Finding) bool {
	switch f.Detector {
	case finding.DetectorFallenOffBus, finding.DetectorAERFatal,
		finding.DetectorGPUCount, finding.DetectorRmInitFailed:
		return true
	case finding.DetectorXid:
		if f.Attr(finding.AttrSecondary) == "true" {
			return false
		}
		if f.Xid == 154 {
			ra := f.Attr(finding.AttrRecoveryAction)
			return ra != "" && ra != "none"
		}
		return criticalXid(f.Xid)
	}
	return false
}

// withDefaults returns c with defaults applied, or an error listing every
// problem.
func (c Config) withDefaults() (Config, error) {
	setDefault(&c.BatchSize, DefaultBatchSize)
	setDefault(&c.FlushInterval, DefaultFlushInterval)
	setDefault(&c.QueueSize, DefaultQueueSize)
	setDefault(&c.HeartbeatInterval, DefaultHeartbeatInterval)
	setDefault(&c.RequestTimeout, DefaultRequestTimeout)
	setDefault(&c.RetryInitialInterval, DefaultRetryInitialInterval)
	setDefault(&c.RetryMaxInterval, DefaultRetryMaxInterval)
	setDefault(&c.ShutdownTimeout, DefaultShutdownTimeout)
	setDefault(&c.SpoolMaxBytes, DefaultSpoolMaxBytes)
	var p []error
	switch {
	case c.CAFile != "" && c.HTTPClient != nil:
		p = append(p, errors.New("caFile: set it or httpClient, not both"))
	case c.CAFile != "":
		pem, err := os.ReadFile(c.CAFile)
		pool := x509.NewCertPool()
		if err != nil {
			p = append(p, fmt.Errorf("caFile: %w", err))
		} else if !pool.AppendCertsFromPEM(pem) {
			p = append(p, fmt.Errorf("caFile: %s holds no PEM certificate", c.CAFile))
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		c.HTTPClient = &http.Client{Transport: tr}
	case c.HTTPClient == nil:
		c.HTTPClient = &http.Client{}
	}
	if c.Critical == nil {
		c.Critical = DefaultCritical
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}

	if c.URL == "" {
		p = append(p, errors.New("url: required"))
	} else if u, err := url.Parse(c.URL); err != nil {
		p = append(p, fmt.Errorf("url: %w", err))
	} else if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		p = append(p, fmt.Errorf("url: %q is not an absolute http(s) URL without query", c.URL))
	}
	if err := finding.CheckName(c.Cluster); err != nil { // the controller refuses every report otherwise
		p = append(p, fmt.Errorf("cluster: %w", err))
	}
	if err := finding.CheckName(c.Node); err != nil {
		p = append(p, fmt.Errorf("node: %w", err))
	}
	if c.BootID == "" {
		p = append(p, errors.New("bootID: required (the controller scopes evidence by boot)"))
	}
	if c.Metrics != nil && c.Registerer != nil {
		p = append(p, errors.New("metrics and registerer: set at most one (NewMetrics registers a shared set)"))
	}
	if c.Token != "" && c.TokenFile != "" {
		p = append(p, errors.New("token and tokenFile: set at most one"))
	}
	if c.BatchSize < 1 || c.BatchSize > finding.MaxFindingsPerReport {
		p = append(p, fmt.Errorf("batchSize: %d is not in 1..%d", c.BatchSize, finding.MaxFindingsPerReport))
	}
	if c.SpoolMaxBytes < 0 {
		p = append(p, fmt.Errorf("spoolMaxBytes: %d must be positive", c.SpoolMaxBytes))
	}
	if c.QueueSize < 1 {
		p = append(p, fmt.Errorf("queueSize: %d must be >= 1", c.QueueSize))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"flushInterval", c.FlushInterval}, {"heartbeatInterval", c.HeartbeatInterval},
		{"requestTimeout", c.RequestTimeout}, {"retryInitialInterval", c.RetryInitialInterval},
		{"retryMaxInterval", c.RetryMaxInterval}, {"shutdownTimeout", c.ShutdownTimeout},
	} {
		if d.v < 0 {
			p = append(p, fmt.Errorf("%s: %v must be positive", d.name, d.v))
		}
	}
	if c.HeartbeatInterval > 0 && c.HeartbeatInterval < c.FlushInterval {
		p = append(p, fmt.Errorf("heartbeatInterval: %v is shorter than flushInterval %v", c.HeartbeatInterval, c.FlushInterval))
	}
	if c.RetryMaxInterval > 0 && c.RetryMaxInterval < c.RetryInitialInterval {
		p = append(p, fmt.Errorf("retryMaxInterval: %v is shorter than retryInitialInterval %v", c.RetryMaxInterval, c.RetryInitialInterval))
	}
	if len(p) > 0 {
		return c, errors.Join(p...)
	}
	c.URL = strings.TrimSuffix(c.URL, "/")
	return c, nil
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}
