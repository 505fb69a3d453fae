package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/fleetrepair/fleetrepair/cmd/runner"
	"github.com/fleetrepair/fleetrepair/controller/config"
	"github.com/fleetrepair/fleetrepair/web/api"
)

// TestLoopback: --agent-auth=none is allowed only on loopback listen
// addresses.
func TestLoopback(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{"127.0.0.1:8080": true, "[::1]:8080": true, "localhost:8080": true,
		":8080": false, "0.0.0.0:8080": false, "10.0.0.5:8080": false, "garbage": false} {
		if got := loopback(addr); got != want {
			t.Errorf("loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

// TestCheckProfilingListen: --profiling-listen takes only a loopback
// address, never --listen's port; empty is off.
func TestCheckProfilingListen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		profiling, listen, wantErr string
	}{
		{"", ":8080", ""},
		{"127.0.0.1:6060", ":8080", ""},
		{"[::1]:6060", ":8080", ""},
		{"localhost:6060", "127.0.0.1:8080", ""},
		{":6060", ":8080", "only a loopback address"},
		{"0.0.0.0:6060", ":8080", "only a loopback address"},
		{"10.0.0.5:6060", ":8080", "only a loopback address"},
		{"nonsense", ":8080", "only a loopback address"},
		{"127.0.0.1:8080", ":8080", "the same port"},
		{"127.0.0.1:18080", "127.0.0.1:18080", "the same port"},
	} {
		err := checkProfilingListen(tc.profiling, tc.listen)
		if (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("checkProfilingListen(%q, %q) = %v, want %q", tc.profiling, tc.listen, err, tc.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "--profiling-listen") {
			t.Errorf("error %q does not name the flag", err)
		}
	}
}

// TestControllerEnv: every controller flag reads its environment variable,
// booleans parse strictly (FLEETREPAIR_DRY_RUN=yes is an error, not "dry run
// off"), and a flag on the command line wins over the environment.
func TestControllerEnv(t *testing.T) {
	for _, tc := range []struct {
		env     map[string]string
		args    []string
		wantErr string
		check   func(*cobra.Command) string
	}{
		{env: map[string]string{"FLEETREPAIR_DRY_RUN": "yes"}, wantErr: "FLEETREPAIR_DRY_RUN"},
		{env: map[string]string{"FLEETREPAIR_WORKERS": "four"}, wantErr: "FLEETREPAIR_WORKERS"},
		{env: map[string]string{"FLEETREPAIR_DRY_RUN": "1", "FLEETREPAIR_WORKERS": "9"}, check: func(c *cobra.Command) string {
			if v, _ := c.Flags().GetBool("dry-run"); !v {
				return "FLEETREPAIR_DRY_RUN=1 did not turn dry run on"
			}
			if v, _ := c.Flags().GetInt("workers"); v != 9 {
				return "FLEETREPAIR_WORKERS=9 ignored"
			}
			return ""
		}},
		// The flood limits and server timeouts are flags with environment
		// fallbacks and web/api's defaults.
		{env: map[string]string{"FLEETREPAIR_SOURCE_RPS": "7", "FLEETREPAIR_TRUSTED_PROXIES": "10.0.0.0/8,192.168.0.0/16",
			"FLEETREPAIR_READ_TIMEOUT": "3s", "FLEETREPAIR_VERIFY_RPS": "2.5"}, check: func(c *cobra.Command) string {
			if v, _ := c.Flags().GetInt("source-rps"); v != 7 {
				return "FLEETREPAIR_SOURCE_RPS=7 ignored"
			}
			if v, _ := c.Flags().GetStringSlice("trusted-proxies"); len(v) != 2 || v[1] != "192.168.0.0/16" {
				return fmt.Sprintf("FLEETREPAIR_TRUSTED_PROXIES read as %q", v)
			}
			if v, _ := c.Flags().GetDuration("read-timeout"); v != 3*time.Second {
				return "FLEETREPAIR_READ_TIMEOUT=3s ignored"
			}
			if v, _ := c.Flags().GetFloat64("verify-rps"); v != 2.5 {
				return "FLEETREPAIR_VERIFY_RPS=2.5 ignored"
			}
			if v, _ := c.Flags().GetInt("agent-burst"); v != api.DefaultAgentBurst {
				return fmt.Sprintf("--agent-burst default %d, want api.DefaultAgentBurst", v)
			}
			if v, _ := c.Flags().GetDuration("idle-timeout"); v != api.DefaultIdleTimeout {
				return fmt.Sprintf("--idle-timeout default %s, want api.DefaultIdleTimeout", v)
			}
			return ""
		}},
		{env: map[string]string{"FLEETREPAIR_WORKERS": "9"}, args: []string{"--workers", "3"}, check: func(c *cobra.Command) string {
			if v, _ := c.Flags().GetInt("workers"); v != 3 {
				return "the command line did not win over the environment"
			}
			return ""
		}},
	} {
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		cmd := newControllerCmd()
		if err := cmd.ParseFlags(tc.args); err != nil {
			t.Fatal(err)
		}
		err := flagsFromEnv(cmd, nil)
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("env %v: error %v, want one naming %s", tc.env, err, tc.wantErr)
		case tc.wantErr == "" && err != nil:
			t.Errorf("env %v: %v", tc.env, err)
		case tc.check != nil:
			if msg := tc.check(cmd); msg != "" {
				t.Errorf("env %v args %v: %s", tc.env, tc.args, msg)
			}
		}
		for k := range tc.env {
			os.Unsetenv(k)
		}
	}
}

// TestEveryControllerFlagHasItsEnv walks the controller's FlagSet: every
// flag reads the environment variable its help promises (envName: the
// named ones, else FLEETREPAIR_<NAME>), a "(env X)" in a flag's help names
// exactly that variable, and a value set only in the environment reaches
// the flag.
func TestEveryControllerFlagHasItsEnv(t *testing.T) {
	cmd := newControllerCmd()
	promised := regexp.MustCompile(`\(env ([A-Z0-9_]+)[;)]`)
	n := 0
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" {
			return
		}
		n++
		key := envName(f.Name, controllerEnv)
		if m := promised.FindStringSubmatch(f.Usage); m != nil && m[1] != key {
			t.Errorf("--%s: help promises env %s, the flag reads %s", f.Name, m[1], key)
		}
		var val, want string
		switch f.Value.Type() {
		case "bool":
			val, want = "true", "true"
			if f.DefValue == "true" {
				val, want = "false", "false"
			}
		case "duration":
			val, want = "7m", "7m0s"
		case "int":
			val, want = "7", "7"
		case "float64":
			val, want = "7.5", "7.5"
		case "string":
			val, want = "from-env", "from-env"
		case "stringArray", "stringSlice":
			val, want = "a=b", "[a=b]"
		default:
			t.Errorf("--%s: flag type %s not covered by this test", f.Name, f.Value.Type())
			return
		}
		t.Run(f.Name, func(t *testing.T) {
			t.Setenv(key, val)
			c := newControllerCmd()
			if err := c.ParseFlags(nil); err != nil {
				t.Fatal(err)
			}
			if err := flagsFromEnv(c, controllerEnv); err != nil {
				t.Fatalf("%s=%s: %v", key, val, err)
			}
			got := c.Flags().Lookup(f.Name)
			if !got.Changed || got.Value.String() != want {
				t.Errorf("%s=%s: --%s = %q (changed %v), want %q", key, val, f.Name, got.Value.String(), got.Changed, want)
			}
		})
	})
	if n < 30 {
		t.Errorf("walked only %d controller flags", n)
	}
}

// TestConfigPrecedence: the file overrides the defaults, a flag or its
// environment variable overrides the file, a typo in the file is refused
// naming the line, and a label cohort set only in the file reaches the
// configuration.
func TestConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(file, []byte("breaker:\n  labels: [topology.kubernetes.io/rack]\nbudgets:\n  deletionsPerHour: 3\n  maxInFlightPerNodePool: 2\nrepair:\n  resync: 20s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	load := func(t *testing.T, args []string, env map[string]string) (config.Config, error) {
		t.Helper()
		for k, v := range env {
			t.Setenv(k, v)
		}
		c := newControllerCmd()
		if err := c.ParseFlags(args); err != nil {
			t.Fatal(err)
		}
		if err := flagsFromEnv(c, controllerEnv); err != nil {
			return config.Config{}, err
		}
		cf, _ := c.Flags().GetString("config")
		pf, _ := c.Flags().GetString("policy")
		return controllerConfig(c.Flags(), cf, pf)
	}
	cfg, err := load(t, []string{"--config", file}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Budgets.DeletionsPerHour != 3 || cfg.Budgets.MaxInFlightPerNodePool != 2 || cfg.Repair.Resync != 20*time.Second ||
		cfg.Budgets.NodePoolDeletionsPerHour != config.Default().Budgets.NodePoolDeletionsPerHour || !slices.Equal(cfg.Breaker.Labels, []string{"topology.kubernetes.io/rack"}) {
		t.Errorf("file config = %+v", cfg)
	}
	t.Run("flag and env over file", func(t *testing.T) {
		cfg, err := load(t, []string{"--config", file, "--deletions-per-hour", "7"}, map[string]string{"FLEETREPAIR_RESYNC": "30s", "FLEETREPAIR_DELETIONS_PER_HOUR": "9"})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Budgets.DeletionsPerHour != 7 || cfg.Repair.Resync != 30*time.Second || cfg.Budgets.MaxInFlightPerNodePool != 2 {
			t.Errorf("%+v %+v, want the flag's 7/h (over env 9), env's 30s resync, the file's 2 in flight", cfg.Budgets, cfg.Repair)
		}
	})
	t.Run("FLEETREPAIR_CONFIG", func(t *testing.T) {
		cfg, err := load(t, nil, map[string]string{"FLEETREPAIR_CONFIG": file, "FLEETREPAIR_DELETIONS_PER_HOUR": "8"})
		if err != nil || cfg.Budgets.DeletionsPerHour != 8 || cfg.Repair.Resync != 20*time.Second {
			t.Errorf("FLEETREPAIR_CONFIG with an env override: %+v, %v", cfg, err)
		}
	})
	typo := filepath.Join(dir, "typo.yaml")
	if err := os.WriteFile(typo, []byte("budgets:\n  deletionsPerHour: 3\n  maxInflightPerNodePool: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := load(t, []string{"--config", typo}, nil); err == nil || !strings.Contains(err.Error(), "typo.yaml") || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("typo: %v, want an error naming the file and line 3", err)
	}
	if _, err := load(t, []string{"--config", file, "--resync", "0s"}, nil); err == nil || !strings.Contains(err.Error(), "repair.resync") {
		t.Errorf("--resync 0s over the file: %v, want refused", err)
	}
}

// TestCheckRetention: a retention the diagnosis history cannot live with is
// refused at start, naming the flag; 0 and anything from the lookback on
// are accepted.
func TestCheckRetention(t *testing.T) {
	t.Parallel()
	week := 7 * 24 * time.Hour
	for _, tc := range []struct {
		retention time.Duration
		wantErr   string
	}{
		{0, ""}, {week, ""}, {30 * 24 * time.Hour, ""},
		{-5 * time.Hour, "must be 0 (keep every finding) or positive"},
		{time.Second, "must be at least repair.lookback (168h0m0s)"},
		{week - time.Hour, "must be at least repair.lookback"},
	} {
		err := checkRetention(tc.retention, week)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("checkRetention(%s) = %v, want nil", tc.retention, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "--finding-retention")):
			t.Errorf("checkRetention(%s) = %v, want an error naming --finding-retention and %q", tc.retention, err, tc.wantErr)
		}
	}
}

// TestCheckLeaseFlags: a bad Lease timing is refused naming only its own
// flag, 0 included; the defaults and a short failover pass.
func TestCheckLeaseFlags(t *testing.T) {
	t.Parallel()
	s := time.Second
	for _, tc := range []struct {
		lease, renew, retry time.Duration
		want                string // "" accepted
	}{
		{runner.DefaultLeaseDuration, runner.DefaultRenewDeadline, runner.DefaultRetryPeriod, ""},
		{5 * s, 3 * s, s, ""},
		{0, 10 * s, 2 * s, "--leader-elect-lease-duration 0s: want more than 0 (default 15s)"},
		{15 * s, 10 * s, 0, "--leader-elect-retry-period 0s: want more than 0 (default 2s)"},
		{1500 * time.Millisecond, s, 200 * time.Millisecond, "--leader-elect-lease-duration 1.5s: want a whole number of seconds"},
		{3 * s, 5 * s, s, "--leader-elect-renew-deadline 5s: want more than 0 and less than the lease duration (3s)"},
		{15 * s, 10 * s, 9 * s, "--leader-elect-retry-period 9s: want more than 0 and the renew deadline (10s) more than 1.2 times it"},
	} {
		err := checkLeaseFlags(runner.LeaderElection{LeaseDuration: tc.lease, RenewDeadline: tc.renew, RetryPeriod: tc.retry})
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)) {
			t.Errorf("checkLeaseFlags(%s, %s, %s) = %v, want %q", tc.lease, tc.renew, tc.retry, err, tc.want)
		}
		if err != nil && strings.Count(err.Error(), "--leader-elect-") != 1 {
			t.Errorf("checkLeaseFlags(%s, %s, %s) = %v: want exactly one flag named", tc.lease, tc.renew, tc.retry, err)
		}
	}
}
