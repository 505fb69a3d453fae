package main

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

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
