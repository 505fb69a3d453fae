package auth

import (
	"errors"
	"testing"
)

func TestRoleFor(t *testing.T) {
	t.Parallel()
	c := OIDCConfig{AdminGroups: []string{"sre"}, ApproverGroups: []string{"oncall"}, ViewerGroups: []string{"eng"}}
	open := OIDCConfig{ApproverGroups: []string{"oncall"}}
	for _, tc := range []struct {
		cfg    OIDCConfig
		groups []string
		want   Role
	}{
		{c, []string{"eng", "sre"}, RoleAdmin},
		{c, []string{"oncall"}, RoleApprover},
		{c, []string{"eng"}, RoleViewer},
		{c, []string{"sales"}, ""},
		{c, nil, ""},
		{open, nil, RoleViewer},
		{open, []string{"oncall"}, RoleApprover},
	} {
		got, err := tc.cfg.RoleFor(tc.groups)
		if got != tc.want || (tc.want == "") != errors.Is(err, ErrForbidden) {
			t.Errorf("RoleFor(%v) with %+v = %q, %v; want %q", tc.groups, tc.cfg, got, err, tc.want)
		}
	}
}

func TestOIDCClaims(t *testing.T) {
	t.Parallel()
	o := &OIDC{cfg: OIDCConfig{GroupsClaim: "roles", UsernameClaim: "email", ApproverGroups: []string{"oncall"}}}
	op, err := o.operator("sub-1", map[string]any{"email": "a@x", "roles": []any{"oncall", 3}})
	if err != nil || op.Name != "a@x" || op.Role != RoleApprover {
		t.Fatalf("list claim: %+v %v", op, err)
	}
	op, err = o.operator("sub-1", map[string]any{"preferred_username": "bob", "roles": "oncall"})
	if err != nil || op.Name != "bob" || op.Role != RoleApprover {
		t.Fatalf("string claim, no email: %+v %v", op, err)
	}
	if op, _ = o.operator("sub-2", map[string]any{}); op.Name != "sub-2" || op.Role != RoleViewer {
		t.Fatalf("no claims: %+v", op)
	}
}

func TestOIDCConfigValidate(t *testing.T) {
	t.Parallel()
	if err := (OIDCConfig{}).Validate(); err == nil {
		t.Fatal("empty config accepted")
	}
	if err := (OIDCConfig{Issuer: "https://i", ClientID: "c", RedirectURL: "https://d/auth/callback"}).Validate(); err == nil {
		t.Fatal("config with nobody able to approve accepted")
	}
}
