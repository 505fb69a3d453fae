package kubeapi

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/fleetrepair/fleetrepair/test/envtest"
)

// TestCompose reads docker-compose.yml (no Docker engine runs here): every
// flag a service's command passes is one its binary defines, and the
// agents can authenticate: the controller runs --agent-auth static (the
// default, TokenReview, needs Kubernetes pods) with the token the agents
// send.
func TestCompose(t *testing.T) {
	root, err := envtest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Services map[string]struct {
			Build struct {
				Dockerfile string `json:"dockerfile"`
			} `json:"build"`
			Environment map[string]string `json:"environment"`
			Command     []string          `json:"command"`
		} `json:"services"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("parse docker-compose.yml: %v", err)
	}
	help := binaryFlags(t)
	flag := func(cmd []string, name string) string {
		for i, a := range cmd {
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v
			}
			if a == name && i+1 < len(cmd) {
				return cmd[i+1]
			}
		}
		return ""
	}
	var controllerToken string
	var agentTokens []string
	for name, s := range doc.Services {
		var bin string
		switch s.Build.Dockerfile {
		case "deploy/Dockerfile.controller":
			bin = "controller"
		case "deploy/Dockerfile.agent":
			bin = "agent"
		default:
			continue
		}
		if _, err := os.Stat(filepath.Join(root, s.Build.Dockerfile)); err != nil {
			t.Errorf("service %s: %v", name, err)
		}
		for _, a := range s.Command[1:] {
			if n, _, _ := strings.Cut(a, "="); strings.HasPrefix(n, "--") && !hasFlag(help[bin], n) {
				t.Errorf("service %s passes %s, which `%s --help` does not list", name, n, bin)
			}
		}
		switch bin {
		case "controller":
			if got := flag(s.Command, "--agent-auth"); got != "static" {
				t.Errorf("controller --agent-auth = %q, want static: compose agents have no ServiceAccount token", got)
			}
			controllerToken = s.Environment["FLEETREPAIR_AGENT_TOKEN"]
			if v := flag(s.Command, "--agent-token"); v != "" {
				controllerToken = v
			}
		case "agent":
			agentTokens = append(agentTokens, flag(s.Command, "--token"))
			if replay := flag(s.Command, "--replay"); replay != "" && !strings.HasPrefix(replay, "/fixtures/") {
				t.Errorf("service %s replays %s, outside the mounted fixtures", name, replay)
			} else if _, err := os.Stat(filepath.Join(root, "test/fixtures/cases", strings.TrimPrefix(replay, "/fixtures/"))); err != nil {
				t.Errorf("service %s: replay file: %v", name, err)
			}
		}
	}
	if controllerToken == "" || len(agentTokens) == 0 || slices.ContainsFunc(agentTokens, func(tok string) bool { return tok != controllerToken }) {
		t.Errorf("controller token %q, agent tokens %q: every agent must send the controller's token", controllerToken, agentTokens)
	}
}
