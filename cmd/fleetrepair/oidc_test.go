package main

import (
	"fmt"
	"testing"

	"github.com/fleetrepair/fleetrepair/controller/auth"
)

func TestParseOIDCRoles(t *testing.T) {
	var c auth.OIDCConfig
	if err := parseOIDCRoles(&c, []string{"sre=admin", "gpu-oncall=approver", "eng=viewer", "ml=viewer"}); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(c.AdminGroups, c.ApproverGroups, c.ViewerGroups); got != "[sre] [gpu-oncall] [eng ml]" {
		t.Fatalf("groups %s", got)
	}
	for _, bad := range []string{"oncall", "=admin", "oncall=root"} {
		if err := parseOIDCRoles(&auth.OIDCConfig{}, []string{bad}); err == nil {
			t.Errorf("--oidc-role %q accepted", bad)
		}
	}
}
