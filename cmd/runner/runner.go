// Package runner composes the controller process: store, diagnosis engine,
// reconciler and HTTP API, each with an owner goroutine under one errgroup.
// `fleetrepair controller`, `fleetrepair-demo` and the end-to-end tests all
// start the controller through it, so they run the same wiring.
package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/certs"
	"github.com/fleetrepair/fleetrepair/controller/config"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/feed"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/remote"
	"github.com/fleetrepair/fleetrepair/controller/repair"
	"github.com/fleetrepair/fleetrepair/controller/shadow"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/web/api"
)

// Options configures a controller.
type Options struct {
	// DatabaseURL is a PostgreSQL connection string.
	DatabaseURL string
	// Migrate applies the embedded migrations at start.
	Migrate bool
	// Listen is the HTTP address ("127.0.0.1:0" picks a free port).
	Listen string
	// Clusters maps cluster names to their Kubernetes access.
	Clusters map[string]*kube.Cluster
	// Config is the controller configuration (controller/config: breakers
	// with their label cohorts, deletion budgets, repair timings, policy
	// overrides); nil means config.Default(). The reconciler and the shadow
	// report receive this one value (repair.ConfigFrom, shadow.FromConfig),
	// and its budgets are applied to every cluster at start.
	Config *config.Config
	// ClusterSecrets, when set, adds the clusters of kubeconfig Secrets,
	// picked up and dropped at run time (Clusters may then be empty).
	ClusterSecrets *ClusterSecrets
	// Crash is the reconciler's fault injection (tests only; see
	// repair.Config.Crash).
	Crash func(point string) bool
	// Operators authenticates humans for approvals (nil: none can approve).
	Operators *auth.Operators
	// LeaderElection, when set, runs per-cluster leader election; the
	// periodic pass then only covers clusters this replica leads.
	LeaderElection *LeaderElection
	// Authenticator checks agents' tokens (auth.StaticToken,
	// *auth.TokenReview); nil accepts every report (tests, insecure setups).
	Authenticator auth.Authenticator
	// TLSCertFile and TLSKeyFile, when both set, make the API serve HTTPS
	// with this key pair (PEM), re-read when the files change (rotation).
	TLSCertFile, TLSKeyFile string
	// Limits bounds what one API caller can make the controller do (rates
	// per source and per agent, shadow reports at once, audit rows); zero
	// fields take web/api's defaults.
	Limits api.Limits
	// Server holds the HTTP server's timeouts and header limit; zero fields
	// take web/api's defaults (api.DefaultReadTimeout, ...).
	Server api.ServerOptions
	// FindingRetention drops findings received longer ago than this, one
	// day's partition at a time (store.MaintainFindings); 0 keeps every
	// finding. Repairs, their audit and diagnoses are always kept.
	FindingRetention time.Duration
	// NoFindingCompaction stops the hourly rewrite of closed days in
	// node-timeline order (store.CompactFindings): for a database whose
	// I/O cannot afford copying a day of findings once (seconds per
	// million rows) or while a partition problem is investigated. Node
	// timelines of closed days then read arrival-ordered pages (about 4
	// times the buffers, docs/scale.md "Compaction of closed days").
	NoFindingCompaction bool
	// OIDC configures the dashboard's login (nil: no OIDC login).
	OIDC *auth.OIDCConfig
	// DevLogin offers the dashboard's password-less local login: only
	// `fleetrepair-demo` sets it.
	DevLogin bool
	// SecureCookies marks the dashboard's session cookie HTTPS-only.
	SecureCookies bool
	// Now is the clock (default time.Now).
	Now func() time.Time
	Log *slog.Logger
}

// Controller is a started controller.
type Controller struct {
	// URL is the API's base URL, e.g. http://127.0.0.1:8080 (https:// with
	// TLS).
	URL   string
	Store *store.Store

	ln   net.Listener
	opts Options
	rec  *repair.Reconciler
	feed *feed.Hub
	srv  *http.Server
	reg  *prometheus.Registry
	// cfg is the controller configuration (Options.Config or the
	// defaults): the budgets of clusters added at run time come from it.
	cfg config.Config
	// events writes the repairs' Kubernetes Events (closed by Run).
	events *kube.Events
}

// Start opens the database (migrating it when asked), builds the reconciler
// and the API, and binds the listener. Call Run to serve.
func Start(ctx context.Context, o Options) (*Controller, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if len(o.Clusters) == 0 && o.ClusterSecrets == nil {
		return nil, errors.New("start controller: no clusters configured (give --cluster or --cluster-secrets-namespace)")
	}
	if cs := o.ClusterSecrets; cs != nil && (cs.Client == nil || cs.Namespace == "" || cs.Connect == nil) {
		return nil, errors.New("start controller: ClusterSecrets needs Client, Namespace and Connect")
	}
	if o.Migrate {
		if err := store.Migrate(ctx, o.DatabaseURL, "up", nil); err != nil {
			return nil, fmt.Errorf("start controller: %w", err)
		}
	}
	st, err := store.Open(ctx, o.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("start controller: %w", err)
	}
	cfg := config.Default()
	if o.Config != nil {
		cfg = *o.Config
	}
	if err := cfg.Validate(); err != nil {
		st.Close()
		return nil, fmt.Errorf("start controller: %w", err)
	}
	for name := range o.Clusters {
		if err := setBudgets(ctx, st, name, cfg.Budgets, o.Now()); err != nil {
			st.Close()
			return nil, fmt.Errorf("start controller: %w", err)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cat := catalog.Default()
	rc, err := repair.ConfigFrom(cfg)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("start controller: %w", err)
	}
	eng, err := diagnose.New(diagnose.Options{Catalog: cat, InstanceTypes: rc.Policy.InstanceTypeOverrides()})
	if err != nil {
		st.Close()
		return nil, err
	}
	events := kube.NewEvents() // starts nothing before the first Event; closed by Run
	rc.Store, rc.Engine, rc.Clusters, rc.Crash, rc.Now, rc.Log, rc.Registerer, rc.Events = st, eng, o.Clusters, o.Crash, o.Now, o.Log, reg, events
	if le := o.LeaderElection; le != nil {
		// A new leader's catch-up queues first what the old one may never
		// have handled: its backlog and the leaderless gap, a Lease
		// duration at most (repair.Config.FreshEvidence).
		lease, _, _ := le.timings()
		rc.FreshEvidence = max(repair.DefaultFreshEvidence, 3*lease)
	}
	rec, err := repair.New(rc)
	if err != nil {
		st.Close()
		return nil, err
	}
	shadowCfg, err := shadow.FromConfig(cfg)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("start controller: %w", err)
	}
	shadowCfg.Store, shadowCfg.Engine = st, eng
	maxRange, maxFindings, lookback := shadowCfg.Limits()
	hub, err := feed.New(feed.Config{Source: st, Registerer: reg, Now: o.Now, Log: o.Log})
	if err != nil {
		st.Close()
		return nil, err
	}
	svc, err := api.New(api.Config{Store: st, Catalog: cat, Serves: rec.Serves, Authenticator: o.Authenticator,
		Feed: hub, Login: o.OIDC != nil || o.DevLogin,
		OnIngest: rec.Trigger, OnFindings: rec.TriggerFindings, ClusterStates: clusterStates(rec), NodeClaims: rec.NodeClaims, PeerNodes: rec.NodeAddresses, Operators: o.Operators, Gatherer: reg, Registerer: reg, Now: o.Now, Log: o.Log, Limits: o.Limits,
		Shadow: func(ctx context.Context, since, until time.Time) (any, error) {
			c := shadowCfg
			c.Clusters = rec.ClusterNames() // the clusters served now
			return c.ReportFunc()(ctx, since, until)
		},
		ShadowLimits: api.ShadowLimits{MaxRangeSeconds: maxRange.Seconds(), MaxFindings: maxFindings, LookbackSeconds: lookback.Seconds()}})
	if err != nil {
		st.Close()
		return nil, err
	}
	h, err := dashboard(ctx, o, st, svc)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("start controller: %w", err)
	}
	sopts, scheme := o.Server, "http"
	sopts.Log = o.Log
	if (o.TLSCertFile == "") != (o.TLSKeyFile == "") {
		st.Close()
		return nil, errors.New("start controller: TLS needs both a certificate file and a key file")
	}
	if o.TLSCertFile != "" {
		rl, err := certs.New(o.TLSCertFile, o.TLSKeyFile)
		if err != nil {
			st.Close()
			return nil, fmt.Errorf("start controller: %w", err)
		}
		sopts.TLS, scheme = rl.ServerConfig(), "https"
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("start controller: listen on %s: %w", o.Listen, err)
	}
	return &Controller{URL: scheme + "://" + ln.Addr().String(), Store: st, ln: ln, opts: o, rec: rec, feed: hub, events: events,
		srv: api.NewServer(h, sopts), reg: reg, cfg: cfg}, nil
}

// Run serves the API and runs the reconciler until ctx ends, then shuts the
// HTTP server down gracefully and closes the store. It returns the first
// error of any part, or nil after a clean shutdown.
func (c *Controller) Run(ctx context.Context) error {
	defer c.Store.Close()
	defer c.events.Close()
	g, ctx := errgroup.WithContext(ctx)
	if le := c.opts.LeaderElection; le != nil {
		c.rec.UseLeaderElection()
		for name, cs := range le.Clients {
			g.Go(func() error { return runElection(ctx, *le, name, cs, c.rec.SetLeading) })
		}
	}
	g.Go(func() error { return c.rec.Run(ctx) })
	g.Go(func() error { return c.feed.Run(ctx) })
	if cs := c.opts.ClusterSecrets; cs != nil {
		w := &remote.Watcher{Client: cs.Client, Namespace: cs.Namespace, Log: c.opts.Log, Registerer: c.reg,
			Handler:  &remoteClusters{c: c, ctx: ctx, elections: map[string]context.CancelFunc{}},
			Reserved: func(name string) bool { return c.opts.Clusters[name] != nil }}
		g.Go(func() error { return w.Run(ctx) })
	}
	g.Go(func() error { c.maintainFindings(ctx); return nil })
	g.Go(func() error { return sweepSessions(ctx, c.Store, c.opts.Now, c.opts.Log) })
	g.Go(func() error {
		serve := func() error { return c.srv.Serve(c.ln) }
		if c.srv.TLSConfig != nil {
			serve = func() error { return c.srv.ServeTLS(c.ln, "", "") }
		}
		if err := serve(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve api: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return c.srv.Shutdown(sctx)
	})
	c.opts.Log.Info("controller running", "url", c.URL, "dry_run", c.cfg.Repair.DryRun, "clusters", len(c.opts.Clusters),
		"cluster_secrets", c.opts.ClusterSecrets != nil)
	return g.Wait()
}

// Clusters returns what the controller knows of each cluster: API server
// reachability and, with leader election, whether this replica leads it.
func (c *Controller) Clusters() []repair.ClusterState { return c.rec.Clusters() }

// setBudgets applies b to cluster's budget rows (a new cluster, or every
// configured one at start).
func setBudgets(ctx context.Context, st *store.Store, cluster string, b config.Budgets, now time.Time) error {
	if _, err := st.SetClusterBudget(ctx, cluster, b.DeletionsPerHour, b.MaxInFlightPerNodePool, now); err != nil {
		return err
	}
	return st.SetNodePoolBudget(ctx, cluster, b.NodePoolDeletionsPerHour, now)
}

func (c *Controller) setBudgets(ctx context.Context, cluster string, b config.Budgets) error {
	if err := setBudgets(ctx, c.Store, cluster, b, c.opts.Now()); err != nil {
		return fmt.Errorf("set budgets of cluster %s: %w", cluster, err)
	}
	return nil
}

// FindingsMaintenanceInterval is how often a controller creates the finding
// partitions ahead, drops those past retention and rewrites one closed day
// in node-timeline order (store.MaintainFindings).
// Partitions are created a week ahead, so a missed pass or an hour of
// database outage costs nothing; a finding received outside every created
// partition lands in the default partition and is moved by the next pass.
const FindingsMaintenanceInterval = time.Hour

// maintainFindings runs store.MaintainFindings at start and then every
// FindingsMaintenanceInterval until ctx ends. Every replica runs it; the
// store serializes concurrent runs. A failed pass is logged and retried at
// the next.
func (c *Controller) maintainFindings(ctx context.Context) {
	t := time.NewTicker(FindingsMaintenanceInterval)
	defer t.Stop()
	for {
		m := store.FindingsMaintenance{Retention: c.opts.FindingRetention}
		if c.opts.NoFindingCompaction {
			m.Compact = -1
		}
		res, err := c.Store.MaintainFindings(ctx, c.opts.Now(), m)
		switch {
		case err != nil && ctx.Err() == nil:
			c.opts.Log.Error("maintain finding partitions", "err", err)
		case res.Created > 0 || len(res.Dropped) > 0 || res.Deleted > 0 || len(res.Compacted) > 0:
			c.opts.Log.Info("maintained finding partitions", "created", res.Created, "dropped", res.Dropped,
				"deleted_default_rows", res.Deleted, "compacted", res.Compacted)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// clusterStates maps the reconciler's view of each cluster into the API's
// type (web/api does not import controller/repair).
func clusterStates(rec *repair.Reconciler) func() []api.ClusterState {
	return func() []api.ClusterState {
		cs := rec.Clusters()
		out := make([]api.ClusterState, 0, len(cs))
		for _, c := range cs {
			out = append(out, api.ClusterState{Name: c.Name, Reachable: c.Reachable, Since: c.Since, LastError: c.LastError, Leading: c.Leading})
		}
		return out
	}
}
