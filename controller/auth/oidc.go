package auth

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"
)

// OIDCConfig configures the dashboard's OpenID Connect login (docs/design.md,
// decision 11): the authorization code flow with PKCE against Issuer, and
// how a human's role is read from the ID token.
type OIDCConfig struct {
	// Issuer is the provider's issuer URL (its discovery document is
	// Issuer + "/.well-known/openid-configuration").
	Issuer       string
	ClientID     string
	ClientSecret string
	// RedirectURL is the dashboard's callback, e.g.
	// https://fleetrepair.example.com/auth/callback; it must be registered
	// with the provider.
	RedirectURL string
	// Scopes requested besides "openid" (default profile, email, groups).
	Scopes []string
	// GroupsClaim is the ID token claim listing the human's groups (default
	// "groups"); a string or a list of strings.
	GroupsClaim string
	// UsernameClaim names the human in audits (default "email"; falls back
	// to preferred_username, then the subject).
	UsernameClaim string
	// AdminGroups, ApproverGroups and ViewerGroups map groups to roles; the
	// highest role wins. Empty ViewerGroups: every human the provider
	// authenticates may view. A human in no configured group is refused.
	AdminGroups, ApproverGroups, ViewerGroups []string
}

// Validate reports a missing field or a group in two role lists.
func (c OIDCConfig) Validate() error {
	var missing []string
	for _, f := range []struct{ name, v string }{{"issuer", c.Issuer}, {"client ID", c.ClientID}, {"redirect URL", c.RedirectURL}} {
		if f.v == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("oidc login: %s required", strings.Join(missing, ", "))
	}
	if len(c.AdminGroups)+len(c.ApproverGroups) == 0 {
		return errors.New("oidc login: no admin or approver groups: nobody could approve a repair (set the admin and approver groups)")
	}
	return nil
}

// RoleFor maps a human's groups to a role: admin if in AdminGroups, else
// approver, else viewer (any human when ViewerGroups is empty). It returns
// an error wrapping ErrForbidden when no role applies.
func (c OIDCConfig) RoleFor(groups []string) (Role, error) {
	in := func(list []string) bool {
		return slices.ContainsFunc(groups, func(g string) bool { return slices.Contains(list, g) })
	}
	switch {
	case in(c.AdminGroups):
		return RoleAdmin, nil
	case in(c.ApproverGroups):
		return RoleApprover, nil
	case len(c.ViewerGroups) == 0 || in(c.ViewerGroups):
		return RoleViewer, nil
	}
	return "", fmt.Errorf("groups %v include none of the viewer, approver or admin groups: %w", groups, ErrForbidden)
}

// OIDC is a configured OpenID provider for human login.
type OIDC struct {
	cfg      OIDCConfig
	oauth    oauth2.Config
	verifier *oidc.IDTokenVerifier
}

// NewOIDC fetches the provider's discovery document and keys. Errors: the
// provider is unreachable or its issuer does not match.
func NewOIDC(ctx context.Context, cfg OIDCConfig) (*OIDC, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.GroupsClaim == "" {
		cfg.GroupsClaim = "groups"
	}
	if cfg.UsernameClaim == "" {
		cfg.UsernameClaim = "email"
	}
	if cfg.Scopes == nil {
		cfg.Scopes = []string{"profile", "email", "groups"}
	}
	p, err := oidc.NewProvider(ctx, cfg.Issuer)
	if err != nil {
		return nil, fmt.Errorf("discover oidc provider %s: %w", cfg.Issuer, err)
	}
	return &OIDC{cfg: cfg,
		oauth: oauth2.Config{ClientID: cfg.ClientID, ClientSecret: cfg.ClientSecret, RedirectURL: cfg.RedirectURL,
			Endpoint: p.Endpoint(), Scopes: append([]string{oidc.ScopeOpenID}, cfg.Scopes...)},
		verifier: p.Verifier(&oidc.Config{ClientID: cfg.ClientID}),
	}, nil
}

// AuthCodeURL is where to send the browser to log in: state and nonce bind
// the callback to this login, verifier is the PKCE secret (S256 challenge).
func (o *OIDC) AuthCodeURL(state, nonce, verifier string) string {
	return o.oauth.AuthCodeURL(state, oidc.Nonce(nonce), oauth2.S256ChallengeOption(verifier))
}

// Exchange redeems the callback's code with the PKCE verifier, verifies the
// ID token (signature, issuer, audience, expiry, nonce) and maps it to an
// operator. Errors wrap ErrUnauthenticated (bad code or token) or
// ErrForbidden (no role).
func (o *OIDC) Exchange(ctx context.Context, code, verifier, nonce string) (Operator, error) {
	tok, err := o.oauth.Exchange(ctx, code, oauth2.VerifierOption(verifier))
	if err != nil {
		return Operator{}, fmt.Errorf("redeem authorization code: %v: %w", err, ErrUnauthenticated)
	}
	raw, ok := tok.Extra("id_token").(string)
	if !ok {
		return Operator{}, fmt.Errorf("token response has no id_token: %w", ErrUnauthenticated)
	}
	idt, err := o.verifier.Verify(ctx, raw)
	if err != nil {
		return Operator{}, fmt.Errorf("verify id token: %v: %w", err, ErrUnauthenticated)
	}
	if idt.Nonce != nonce {
		return Operator{}, fmt.Errorf("id token nonce does not match this login: %w", ErrUnauthenticated)
	}
	var claims map[string]any
	if err := idt.Claims(&claims); err != nil {
		return Operator{}, fmt.Errorf("decode id token claims: %v: %w", err, ErrUnauthenticated)
	}
	return o.operator(idt.Subject, claims)
}

func (o *OIDC) operator(subject string, claims map[string]any) (Operator, error) {
	var groups []string
	switch g := claims[o.cfg.GroupsClaim].(type) {
	case string:
		groups = []string{g}
	case []any:
		for _, v := range g {
			if s, ok := v.(string); ok {
				groups = append(groups, s)
			}
		}
	}
	name := subject
	for _, c := range []string{o.cfg.UsernameClaim, "preferred_username"} {
		if s, ok := claims[c].(string); ok && s != "" {
			name = s
			break
		}
	}
	role, err := o.cfg.RoleFor(groups)
	if err != nil {
		return Operator{}, fmt.Errorf("%s: %w", name, err)
	}
	return Operator{Name: name, Role: role}, nil
}
