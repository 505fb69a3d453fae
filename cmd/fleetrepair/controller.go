package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fleetrepair/fleetrepair/cmd/runner"
	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/config"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/policy"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/web/api"
)

func newControllerCmd() *cobra.Command {
	var (
		o                                    runner.Options
		flagCfg                              = config.Default() // the flags' defaults (configFlags reads the values given)
		configFile, policyFile               string
		clusters, agentSAs                   []string
		agentAuth, agentToken, agentAudience string
		leaderElect                          bool
		operatorsFile                        string
		leNamespace, leIdentity              string
		leTimings                            runner.LeaderElection
		oidc                                 auth.OIDCConfig
		oidcRoles                            []string
		kubeQPS                              float64
		kubeBurst                            int
		secretsNS, secretsKubeconfig         string
		findingCompaction                    bool
		profilingListen                      string
	)
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run the controller: ingest, diagnosis, repair ledger, API",
		Long: `Run the controller.

Clusters are given as --cluster NAME=KUBECONFIG (repeatable), or NAME=in-cluster
for the cluster the controller runs in.

--config FILE (env FLEETREPAIR_CONFIG) reads the controller configuration
(docs/config.md): breakers and their label cohorts, deletion budgets, repair
timings and policy overrides. A flag that sets the same thing wins over the
file: flag, then environment, then file, then default.

Every flag has an environment fallback,
FLEETREPAIR_ and the flag's name in capitals with underscores (--dry-run:
FLEETREPAIR_DRY_RUN=true), except --database-url (DATABASE_URL) and
--leader-elect-namespace / --leader-elect-identity (POD_NAMESPACE, POD_NAME).
A flag given on the command line wins; a malformed value (FLEETREPAIR_DRY_RUN=yes)
stops the controller with an error naming the variable.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := flagsFromEnv(cmd, controllerEnv); err != nil {
				return err
			}
			if o.DatabaseURL == "" {
				return errors.New("--database-url (or DATABASE_URL) is required")
			}
			if err := checkProfilingListen(profilingListen, o.Listen); err != nil {
				return err
			}
			cfg, err := controllerConfig(cmd.Flags(), configFile, policyFile)
			if err != nil {
				return err
			}
			o.Config = &cfg
			o.NoFindingCompaction = !findingCompaction
			if err := checkRetention(o.FindingRetention, cfg.Repair.Lookback); err != nil {
				return err
			}
			if kubeQPS <= 0 || kubeBurst <= 0 {
				return fmt.Errorf("--kube-api-qps and --kube-api-burst must be > 0 (got %g, %d)", kubeQPS, kubeBurst)
			}
			if len(clusters) == 0 && secretsNS == "" {
				return errors.New("at least one --cluster NAME=KUBECONFIG|in-cluster, or --cluster-secrets-namespace, is required")
			}
			o.Clusters = map[string]*kube.Cluster{}
			reviewers := map[string]kubernetes.Interface{}
			o.Log = slog.New(slog.NewJSONHandler(os.Stderr, nil))
			if operatorsFile != "" {
				ops, err := auth.LoadOperators(operatorsFile)
				if err != nil {
					return err
				}
				o.Operators = ops
			}
			// Checked with or without --leader-elect: a bad timing is a
			// mistake either way, and would surface at the next rollout
			// that turns election on.
			if err := checkLeaseFlags(leTimings); err != nil {
				return err
			}
			if leaderElect {
				if leNamespace == "" {
					return errors.New("--leader-elect needs --leader-elect-namespace (or POD_NAMESPACE)")
				}
				if leIdentity == "" {
					h, _ := os.Hostname()
					leIdentity = h
				}
				le := leTimings
				le.Clients, le.Namespace, le.Identity = reviewers, leNamespace, leIdentity
				o.LeaderElection = &le
			}
			switch agentAuth {
			case "tokenreview":
				o.Authenticator = &auth.TokenReview{Clusters: reviewers, Audience: agentAudience, ServiceAccounts: agentSAs}
			case "static":
				if agentToken == "" {
					return errors.New("--agent-auth=static needs --agent-token (or FLEETREPAIR_AGENT_TOKEN)")
				}
				o.Authenticator = auth.StaticToken{Token: agentToken}
			case "none":
				if !loopback(o.Listen) {
					return fmt.Errorf("--agent-auth=none lets anyone report findings for any node: it is allowed only on a loopback --listen address (127.0.0.1:PORT, [::1]:PORT, localhost:PORT), not %q; use tokenreview (or static for a demo)", o.Listen)
				}
				o.Log.Warn("agent authentication is OFF (--agent-auth=none): anyone who reaches the API can report findings for any node")
			default:
				return fmt.Errorf("--agent-auth %q: want tokenreview, static or none", agentAuth)
			}
			if oidc.Issuer != "" || oidc.ClientID != "" {
				oidc.ClientSecret = os.Getenv("FLEETREPAIR_OIDC_CLIENT_SECRET")
				if err := parseOIDCRoles(&oidc, oidcRoles); err != nil {
					return err
				}
				if err := oidc.Validate(); err != nil {
					return fmt.Errorf("--oidc-*: %w", err)
				}
				o.OIDC = &oidc
				o.SecureCookies = strings.HasPrefix(oidc.RedirectURL, "https://")
			}
			// Connect last: every configuration error above is reported as
			// itself, not hidden behind an unreachable cluster. (The leader
			// election and TokenReview set up above hold the reviewers map.)
			for _, c := range clusters {
				name, path, ok := strings.Cut(c, "=")
				if !ok || name == "" || path == "" {
					return fmt.Errorf("--cluster %q: want NAME=KUBECONFIG or NAME=in-cluster", c)
				}
				if o.Clusters[name] != nil {
					return fmt.Errorf("--cluster %q: cluster %s given twice", c, name)
				}
				k, cs, err := clusterFrom(name, path, kube.CachedOptions{QPS: float32(kubeQPS), Burst: kubeBurst})
				if err != nil {
					return err
				}
				o.Clusters[name], reviewers[name] = k, cs
			}
			if secretsNS != "" {
				cs, err := homeClient(secretsKubeconfig)
				if err != nil {
					return err
				}
				copts := kube.CachedOptions{QPS: float32(kubeQPS), Burst: kubeBurst}
				o.ClusterSecrets = &runner.ClusterSecrets{Client: cs, Namespace: secretsNS,
					Connect: func(name string, cfg *rest.Config) (*kube.Cluster, kubernetes.Interface, error) {
						return clusterFromConfig(name, cfg, copts)
					}}
			}
			if profilingListen != "" {
				if err := serveProfiling(cmd.Context(), profilingListen, o.Log); err != nil {
					return err
				}
			}
			c, err := runner.Start(cmd.Context(), o)
			if err != nil {
				return err
			}
			return c.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.DatabaseURL, "database-url", "", "PostgreSQL connection string (env DATABASE_URL)")
	f.BoolVar(&o.Migrate, "migrate", false, "apply database migrations at start")
	f.StringVar(&o.Listen, "listen", ":8080", "HTTP listen address for the API, /metrics, /livez, /readyz")
	f.StringVar(&profilingListen, "profiling-listen", "", "serve Go's net/http/pprof profiles on this loopback address, e.g. 127.0.0.1:6060 (env FLEETREPAIR_PROFILING_LISTEN; empty: off). Unauthenticated, so only loopback is accepted: reach it with kubectl port-forward")
	f.StringVar(&o.TLSCertFile, "tls-cert-file", "", "serve HTTPS with this PEM certificate (re-read when it changes; env FLEETREPAIR_TLS_CERT_FILE); needs --tls-key-file")
	f.StringVar(&o.TLSKeyFile, "tls-key-file", "", "PEM private key of --tls-cert-file (env FLEETREPAIR_TLS_KEY_FILE)")
	f.StringArrayVar(&clusters, "cluster", nil, "NAME=KUBECONFIG or NAME=in-cluster (repeatable)")
	f.StringVar(&secretsNS, "cluster-secrets-namespace", "", "also serve the clusters of kubeconfig Secrets labelled fleetrepair.io/secret-type=cluster in this namespace, picked up and dropped without a restart (env FLEETREPAIR_CLUSTER_SECRETS_NAMESPACE; docs/install.md)")
	f.StringVar(&secretsKubeconfig, "cluster-secrets-kubeconfig", "in-cluster", "kubeconfig of the cluster holding those Secrets (env FLEETREPAIR_CLUSTER_SECRETS_KUBECONFIG; default the cluster the controller runs in)")
	f.StringVar(&configFile, "config", "", "controller configuration file: breakers and label cohorts, budgets, repair timings, policy (docs/config.md; env FLEETREPAIR_CONFIG); flags override it")
	f.BoolVar(&flagCfg.Repair.DryRun, "dry-run", flagCfg.Repair.DryRun, "record every decision, delete no NodeClaim (config repair.dryRun)")
	f.DurationVar(&flagCfg.Repair.Toleration, "toleration", flagCfg.Repair.Toleration, "override every reason's toleration window (e.g. 30s for demos; 0 = catalog defaults: 10m accelerated hardware, 30m other; config repair.toleration)")
	f.DurationVar(&flagCfg.Repair.Resync, "resync", flagCfg.Repair.Resync, "period of the pass over open repairs (config repair.resync)")
	f.DurationVar(&o.FindingRetention, "finding-retention", 30*24*time.Hour,
		"drop findings received longer ago than this, a day's partition at a time (0 keeps them all; repairs and audit are always kept)")
	f.BoolVar(&findingCompaction, "finding-compaction", true,
		"rewrite each closed day's findings in node-timeline order once, 2h after the day ends (env FLEETREPAIR_FINDING_COMPACTION; false: never)")
	f.IntVar(&flagCfg.Repair.Workers, "workers", flagCfg.Repair.Workers, "nodes reconciled at once (env FLEETREPAIR_WORKERS; config repair.workers); each holds at most one database connection")
	f.Float64Var(&kubeQPS, "kube-api-qps", kube.DefaultQPS, "client-side request rate limit per cluster API server (env FLEETREPAIR_KUBE_API_QPS); reads come from informer caches, so this meters writes and watches")
	f.IntVar(&kubeBurst, "kube-api-burst", kube.DefaultBurst, "client-side request burst per cluster API server (env FLEETREPAIR_KUBE_API_BURST)")
	f.StringVar(&policyFile, "policy", "", "policy file with per-reason and per-NodePool overrides (toleration, action, disabled); see docs/policy.md; replaces the config's policy")
	f.IntVar(&flagCfg.Budgets.DeletionsPerHour, "deletions-per-hour", flagCfg.Budgets.DeletionsPerHour, "NodeClaim deletions each cluster may start per sliding hour (0 stops all; config budgets.deletionsPerHour)")
	f.IntVar(&flagCfg.Budgets.NodePoolDeletionsPerHour, "nodepool-deletions-per-hour", flagCfg.Budgets.NodePoolDeletionsPerHour, "NodeClaim deletions each NodePool may start per sliding hour (config budgets.nodePoolDeletionsPerHour)")
	f.IntVar(&flagCfg.Budgets.MaxInFlightPerNodePool, "max-in-flight-per-nodepool", flagCfg.Budgets.MaxInFlightPerNodePool, "NodeClaim deletions in progress at once per NodePool (config budgets.maxInFlightPerNodePool)")
	f.StringVar(&operatorsFile, "operators-file", "", "YAML list of operators {name, role: viewer|approver|admin|reporter, tokenSHA256}: who may read, approve/reject repairs, resume breakers, send job reports (README, \"Who may do what\")")
	f.BoolVar(&leaderElect, "leader-elect", false, "per-cluster leader election (Lease fleetrepair-controller): each cluster is reconciled by the replica holding its Lease, the others forward its ingest triggers; run with it on when there is more than one replica")
	f.StringVar(&leNamespace, "leader-elect-namespace", "", "namespace of the Lease in every cluster (env POD_NAMESPACE)")
	f.StringVar(&leIdentity, "leader-elect-identity", "", "this replica's identity (env POD_NAME; default the host name)")
	f.DurationVar(&leTimings.LeaseDuration, "leader-elect-lease-duration", runner.DefaultLeaseDuration, "how long a replica that stopped renewing keeps its clusters' Leases: a dead leader's clusters wait this long for another replica (whole seconds)")
	f.DurationVar(&leTimings.RenewDeadline, "leader-elect-renew-deadline", runner.DefaultRenewDeadline, "how long the leader tries to renew a Lease before it stops reconciling that cluster (less than the lease duration)")
	f.DurationVar(&leTimings.RetryPeriod, "leader-elect-retry-period", runner.DefaultRetryPeriod, "how often replicas try to take or renew a Lease (the renew deadline must exceed 1.2 times it)")
	f.StringVar(&agentAuth, "agent-auth", "tokenreview", "how agents authenticate: tokenreview (projected ServiceAccount tokens, validated against the agent's cluster), static (one shared token, demo/dev), none (insecure)")
	f.StringVar(&agentToken, "agent-token", "", "the shared token of --agent-auth=static")
	f.StringVar(&agentAudience, "agent-audience", auth.DefaultAudience, "audience agents' projected tokens must carry")
	f.StringArrayVar(&agentSAs, "agent-service-account", nil, "accept only these subjects, e.g. system:serviceaccount:fleetrepair:fleetrepair-agent (repeatable; default: any bound token)")
	// Flood limits and server timeouts (issue 11; web/api/guard.go and
	// web/api/server.go document each); 0 keeps the default shown.
	f.IntVar(&o.Limits.SourceRPS, "source-rps", api.DefaultSourceRPS, "requests per second one source may make to the read and operator routes of /api/v1 (agents' reports are limited per agent); a negative value turns the limit off")
	f.Float64Var(&o.Limits.AgentRPS, "agent-rps", api.DefaultAgentRPS, "reports per second one agent (cluster/node) may send")
	f.IntVar(&o.Limits.AgentBurst, "agent-burst", api.DefaultAgentBurst, "reports one agent may send at once above --agent-rps (a spool drained after an outage)")
	f.Float64Var(&o.Limits.VerifyRPS, "verify-rps", api.DefaultVerifyRPS, "tokens per second from one source that are not in the TokenReview cache and so cost a TokenReview")
	f.IntVar(&o.Limits.VerifyBurst, "verify-burst", api.DefaultVerifyBurst, "uncached tokens one source may present at once above --verify-rps")
	f.IntVar(&o.Limits.ShadowConcurrent, "shadow-concurrent", api.DefaultShadowConcurrent, "shadow reports computed at once (each holds its findings in memory)")
	f.IntVar(&o.Limits.AuditRowsPerMinute, "audit-rows-per-minute", api.DefaultAuditRowsPerMinute, "security_audit rows written for denials per minute; the others are counted")
	f.StringSliceVar(&o.Limits.TrustedProxies, "trusted-proxies", nil, "CIDR prefixes of reverse proxies whose X-Forwarded-For names the client for the per-source limits, e.g. 10.0.0.0/8 (default none: the TCP peer is the source)")
	f.DurationVar(&o.Server.ReadHeaderTimeout, "read-header-timeout", api.DefaultReadHeaderTimeout, "longest time to read a request's headers")
	f.DurationVar(&o.Server.ReadTimeout, "read-timeout", api.DefaultReadTimeout, "longest time to read a whole request, body included (a slow-body client is cut off after it)")
	f.DurationVar(&o.Server.WriteTimeout, "write-timeout", api.DefaultWriteTimeout, "longest time from a request's headers to the end of its answer (the shadow report computes for minutes)")
	f.DurationVar(&o.Server.IdleTimeout, "idle-timeout", api.DefaultIdleTimeout, "keep-alive connections idle this long are closed")
	f.IntVar(&o.Server.MaxHeaderBytes, "max-header-bytes", api.DefaultMaxHeaderBytes, "largest request header block, bytes")
	f.StringVar(&oidc.Issuer, "oidc-issuer-url", "", "dashboard login: OpenID Connect issuer URL, e.g. https://dex.example.com (client secret from env FLEETREPAIR_OIDC_CLIENT_SECRET, never a flag); empty: no login, the dashboard stays closed")
	f.StringVar(&oidc.ClientID, "oidc-client-id", "", "dashboard login: OAuth2 client ID registered with the issuer")
	f.StringVar(&oidc.RedirectURL, "oidc-redirect-url", "", "dashboard login: callback URL registered with the issuer, https://HOST/auth/callback (https marks the session cookie Secure)")
	f.StringVar(&oidc.GroupsClaim, "oidc-groups-claim", "groups", "dashboard login: ID token claim listing the human's groups")
	f.StringVar(&oidc.UsernameClaim, "oidc-username-claim", "email", "dashboard login: ID token claim naming the human in audits (falls back to preferred_username, then sub)")
	f.StringSliceVar(&oidc.Scopes, "oidc-scopes", []string{"profile", "email", "groups"}, "dashboard login: scopes requested besides openid")
	f.StringArrayVar(&oidcRoles, "oidc-role", nil, "GROUP=ROLE: members of GROUP are viewer, approver or admin (repeatable; the highest wins). With no viewer group every human the issuer authenticates may view")
	return cmd
}

// controllerEnv names the environment variables of the controller flags
// that do not read FLEETREPAIR_<NAME> (flagsFromEnv).
var controllerEnv = map[string]string{"database-url": "DATABASE_URL",
	"leader-elect-namespace": "POD_NAMESPACE", "leader-elect-identity": "POD_NAME"}

// configFlags are the controller flags that set a key of the controller
// configuration: when one is given (command line or environment) its value
// replaces the file's.
var configFlags = map[string]func(dst *config.Config, fs *pflag.FlagSet) error{
	"dry-run": func(d *config.Config, fs *pflag.FlagSet) (err error) {
		d.Repair.DryRun, err = fs.GetBool("dry-run")
		return err
	},
	"toleration": func(d *config.Config, fs *pflag.FlagSet) (err error) {
		d.Repair.Toleration, err = fs.GetDuration("toleration")
		return err
	},
	"resync": func(d *config.Config, fs *pflag.FlagSet) (err error) {
		d.Repair.Resync, err = fs.GetDuration("resync")
		return err
	},
	"workers": func(d *config.Config, fs *pflag.FlagSet) (err error) {
		d.Repair.Workers, err = fs.GetInt("workers")
		return err
	},
	"deletions-per-hour": func(d *config.Config, fs *pflag.FlagSet) (err error) {
		d.Budgets.DeletionsPerHour, err = fs.GetInt("deletions-per-hour")
		return err
	},
	"nodepool-deletions-per-hour": func(d *config.Config, fs *pflag.FlagSet) (err error) {
		d.Budgets.NodePoolDeletionsPerHour, err = fs.GetInt("nodepool-deletions-per-hour")
		return err
	},
	"max-in-flight-per-nodepool": func(d *config.Config, fs *pflag.FlagSet) (err error) {
		d.Budgets.MaxInFlightPerNodePool, err = fs.GetInt("max-in-flight-per-nodepool")
		return err
	},
}

// controllerConfig returns the effective controller configuration: the
// file (config.Load; none: config.Default), then every configuration flag
// that was given (configFlags, after flagsFromEnv: the command line or the
// environment), then --policy, which replaces the file's policy. The
// result is validated once; an error names the file and line, or the key.
func controllerConfig(fs *pflag.FlagSet, file, policyFile string) (config.Config, error) {
	cat := catalog.Default()
	cfg := config.Default()
	if file != "" {
		var err error
		if cfg, err = config.Load(file, cat); err != nil {
			return config.Config{}, err
		}
	}
	for name, apply := range configFlags {
		if f := fs.Lookup(name); f != nil && f.Changed {
			if err := apply(&cfg, fs); err != nil {
				return config.Config{}, fmt.Errorf("--%s: %w", name, err)
			}
		}
	}
	if policyFile != "" {
		p, err := policy.Load(policyFile, cat)
		if err != nil {
			return config.Config{}, err
		}
		cfg.Policy, cfg.PolicyFile = p, policyFile
	}
	if err := cfg.Validate(); err != nil {
		return config.Config{}, fmt.Errorf("controller configuration (flags over %s): %w", orDefaults(file), err)
	}
	return cfg, nil
}

func orDefaults(file string) string {
	if file == "" {
		return "the defaults"
	}
	return file
}

// loopback reports whether the listen address binds a loopback interface
// only.
func loopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkProfilingListen refuses a --profiling-listen address that is not
// loopback (the profiles are unauthenticated and show the process's memory)
// or that shares --listen's port (the API's listener would then fail with
// an error that names only --listen). Empty profiling is off: no error.
func checkProfilingListen(profiling, listen string) error {
	if profiling == "" {
		return nil
	}
	if !loopback(profiling) {
		return fmt.Errorf("--profiling-listen %q: the profiles are unauthenticated, so only a loopback address is allowed (127.0.0.1:PORT, [::1]:PORT, localhost:PORT); reach it with kubectl port-forward", profiling)
	}
	_, pport, _ := net.SplitHostPort(profiling)
	if _, lport, err := net.SplitHostPort(listen); err == nil && lport == pport && pport != "0" {
		return fmt.Errorf("--profiling-listen %q and --listen %q: the same port; give profiling a port of its own", profiling, listen)
	}
	return nil
}

// parseOIDCRoles maps --oidc-role GROUP=ROLE values into c's group lists.
func parseOIDCRoles(c *auth.OIDCConfig, roles []string) error {
	for _, v := range roles {
		group, role, ok := strings.Cut(v, "=")
		if !ok || group == "" {
			return fmt.Errorf("--oidc-role %q: want GROUP=ROLE, e.g. gpu-oncall=approver", v)
		}
		switch auth.Role(role) {
		case auth.RoleViewer:
			c.ViewerGroups = append(c.ViewerGroups, group)
		case auth.RoleApprover:
			c.ApproverGroups = append(c.ApproverGroups, group)
		case auth.RoleAdmin:
			c.AdminGroups = append(c.AdminGroups, group)
		default:
			return fmt.Errorf("--oidc-role %q: role %q is not viewer, approver or admin", v, role)
		}
	}
	return nil
}

// clusterFrom builds a cached cluster from a kubeconfig (or the in-cluster
// config) and a clientset for TokenReview and leader election, each with
// its own client-side limiter: a TokenReview burst never delays repair
// writes, and repair writes never delay agents' authentication.
func clusterFrom(name, path string, o kube.CachedOptions) (*kube.Cluster, kubernetes.Interface, error) {
	cfg, err := restConfig(path)
	if err != nil {
		return nil, nil, fmt.Errorf("load kubeconfig for cluster %s: %w", name, err)
	}
	return clusterFromConfig(name, cfg, o)
}

// clusterFromConfig is clusterFrom for a loaded client config (a cluster
// Secret's kubeconfig).
func clusterFromConfig(name string, cfg *rest.Config, o kube.CachedOptions) (*kube.Cluster, kubernetes.Interface, error) {
	k, err := kube.NewCached(name, cfg, o)
	if err != nil {
		return nil, nil, err
	}
	ccfg := rest.CopyConfig(cfg)
	ccfg.QPS, ccfg.Burst, ccfg.Timeout = tokenReviewQPS, tokenReviewBurst, kube.DefaultRequestTimeout
	cs, err := kubernetes.NewForConfig(ccfg)
	if err != nil {
		return nil, nil, fmt.Errorf("build clientset for cluster %s: %w", name, err)
	}
	return k, cs, nil
}

// restConfig loads a kubeconfig file, or the in-cluster config for the
// path "in-cluster".
func restConfig(path string) (*rest.Config, error) {
	if path == "in-cluster" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", path)
}

// homeClient is a clientset of the cluster holding the cluster Secrets.
func homeClient(path string) (kubernetes.Interface, error) {
	cfg, err := restConfig(path)
	if err != nil {
		return nil, fmt.Errorf("--cluster-secrets-kubeconfig %s: %w", path, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("--cluster-secrets-kubeconfig %s: %w", path, err)
	}
	return cs, nil
}

// Client-side limits of the TokenReview / leader-election clientset. Each
// agent's token is reviewed once per cache lifetime, so steady state is far
// below this; 100/s lets 10,000 agents restarted at once be reviewed in
// under two minutes (client-go's default of 5/s let 9% of 300 agents' reports
// through at 100 reports/s, issue 9).
const (
	tokenReviewQPS   = 100
	tokenReviewBurst = 200
)

func newMigrateCmd() *cobra.Command {
	var dsn string
	cmd := &cobra.Command{
		Use:       "migrate up|down|reset|status",
		Short:     "Apply (up), roll back one (down), roll back all (reset) or list (status) the database migrations",
		Args:      cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs),
		ValidArgs: []string{store.MigrateUp, store.MigrateDown, store.MigrateReset, store.MigrateStatus},
		RunE: func(cmd *cobra.Command, args []string) error {
			if dsn == "" {
				return errors.New("--database-url (or DATABASE_URL) is required")
			}
			return store.Migrate(cmd.Context(), dsn, args[0], cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&dsn, "database-url", envOr("DATABASE_URL", ""), "PostgreSQL connection string (env DATABASE_URL)")
	return cmd
}

// leaseFlags are the Lease timing flags, by runner.TimingError's Timing,
// with their defaults.
var leaseFlags = map[string]struct {
	flag string
	def  time.Duration
}{
	"lease duration": {"--leader-elect-lease-duration", runner.DefaultLeaseDuration},
	"renew deadline": {"--leader-elect-renew-deadline", runner.DefaultRenewDeadline},
	"retry period":   {"--leader-elect-retry-period", runner.DefaultRetryPeriod},
}

// checkLeaseFlags refuses Lease timings the election cannot use
// (runner.LeaderElection.CheckTimings), naming the flag; 0 is refused too
// (the flags' defaults are the defaults, so a 0 is a mistake, where
// runner.LeaderElection would take it for the default).
func checkLeaseFlags(le runner.LeaderElection) error {
	for i, v := range []time.Duration{le.LeaseDuration, le.RenewDeadline, le.RetryPeriod} {
		if v == 0 { // in this order, so the first zero is the one named
			f := leaseFlags[[...]string{"lease duration", "renew deadline", "retry period"}[i]]
			return fmt.Errorf("%s 0s: want more than 0 (default %s)", f.flag, f.def)
		}
	}
	var te *runner.TimingError
	if err := le.CheckTimings(); errors.As(err, &te) {
		return fmt.Errorf("%s %s: want %s", leaseFlags[te.Timing].flag, te.Value, te.Want)
	} else if err != nil {
		return err
	}
	return nil
}

// checkRetention refuses a --finding-retention the history cannot live
// with: negative, or shorter than repair.lookback (lookback), the history
// of earlier boots a diagnosis reads (a fault that returns after its
// remedy escalates only if its first occurrence is still stored). 0 keeps
// every finding.
func checkRetention(retention, lookback time.Duration) error {
	switch {
	case retention < 0:
		return fmt.Errorf("--finding-retention %s: must be 0 (keep every finding) or positive", retention)
	case retention > 0 && retention < lookback:
		return fmt.Errorf("--finding-retention %s: must be at least repair.lookback (%s), the history a diagnosis reads; 0 keeps every finding", retention, lookback)
	}
	return nil
}
