package auth_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/fleetrepair/fleetrepair/controller/auth"
)

// apiServer is a fake cluster whose TokenReview answers from a table of
// known tokens, as an API server's authenticator would.
type token struct {
	user      string
	node      string
	audiences []string
	expired   bool
}

func fakeCluster(tokens map[string]token, calls *atomic.Int32) kubernetes.Interface {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		calls.Add(1)
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		tok, ok := tokens[tr.Spec.Token]
		switch {
		case !ok:
			tr.Status = authnv1.TokenReviewStatus{Error: "invalid bearer token"}
		case tok.expired:
			tr.Status = authnv1.TokenReviewStatus{Error: "token has expired"}
		default:
			var aud []string
			for _, want := range tr.Spec.Audiences {
				for _, have := range tok.audiences {
					if want == have {
						aud = append(aud, want)
					}
				}
			}
			if len(aud) == 0 {
				tr.Status = authnv1.TokenReviewStatus{Error: "token audiences is invalid for the target audiences"}
				break
			}
			extra := map[string]authnv1.ExtraValue{}
			if tok.node != "" {
				extra[auth.NodeNameExtra] = authnv1.ExtraValue{tok.node}
			}
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: aud,
				User: authnv1.UserInfo{Username: tok.user, Extra: extra}}
		}
		return true, tr, nil
	})
	return cs
}

const agentSA = "system:serviceaccount:fleetrepair:fleetrepair-agent"

func TestTokenReview(t *testing.T) {
	t.Parallel()
	var callsA, callsB atomic.Int32
	a := map[string]token{
		"good-n1":   {user: agentSA, node: "n1", audiences: []string{"fleetrepair"}},
		"wrong-aud": {user: agentSA, node: "n1", audiences: []string{"https://kubernetes.default.svc"}},
		"expired":   {user: agentSA, node: "n1", audiences: []string{"fleetrepair"}, expired: true},
		"unbound":   {user: agentSA, audiences: []string{"fleetrepair"}},
		"other-sa":  {user: "system:serviceaccount:default:default", node: "n1", audiences: []string{"fleetrepair"}},
	}
	b := map[string]token{"good-b": {user: agentSA, node: "b1", audiences: []string{"fleetrepair"}}}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	tr := &auth.TokenReview{Clusters: map[string]kubernetes.Interface{"a": fakeCluster(a, &callsA), "b": fakeCluster(b, &callsB)},
		ServiceAccounts: []string{agentSA}, Now: func() time.Time { return now }}
	ctx := context.Background()

	tests := []struct {
		name, token, cluster, node string
		want                       error
	}{
		{"valid token for its own node", "good-n1", "a", "n1", nil},
		{"another node", "good-n1", "a", "n2", auth.ErrForbidden},
		{"another cluster", "good-b", "a", "b1", auth.ErrUnauthenticated},
		{"cluster not served", "good-n1", "zz", "n1", auth.ErrUnauthenticated},
		{"wrong audience", "wrong-aud", "a", "n1", auth.ErrUnauthenticated},
		{"expired token", "expired", "a", "n1", auth.ErrUnauthenticated},
		{"token not bound to a pod", "unbound", "a", "n1", auth.ErrForbidden},
		{"not the agent service account", "other-sa", "a", "n1", auth.ErrForbidden},
		{"no token", "", "a", "n1", auth.ErrUnauthenticated},
		{"garbage", "garbage", "a", "n1", auth.ErrUnauthenticated},
	}
	for _, tc := range tests {
		id, err := tr.Authenticate(ctx, tc.token, tc.cluster)
		if err == nil {
			err = auth.Authorize(id, tc.cluster, tc.node)
		}
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	// A positive review is cached for its TTL, then asked again.
	before := callsA.Load()
	if _, err := tr.Authenticate(ctx, "good-n1", "a"); err != nil {
		t.Fatal(err)
	}
	if callsA.Load() != before {
		t.Fatal("a cached token was reviewed again within the TTL")
	}
	now = now.Add(auth.DefaultReviewTTL)
	if _, err := tr.Authenticate(ctx, "good-n1", "a"); err != nil {
		t.Fatal(err)
	}
	if callsA.Load() != before+1 {
		t.Fatal("an expired cache entry was not reviewed again")
	}
}

// TestTokenReviewNegativeCache: a rejected token is answered from a bounded
// cache for NegativeTTL, and a flood of distinct garbage tokens never evicts
// an accepted one (issue 11: 50 garbage tokens/s locked real agents out).
func TestTokenReviewNegativeCache(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	tokens := map[string]token{"good": {user: agentSA, node: "n1", audiences: []string{"fleetrepair"}}}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	tr := &auth.TokenReview{Clusters: map[string]kubernetes.Interface{"a": fakeCluster(tokens, &calls)},
		CacheSize: 8, NegativeTTL: 10 * time.Second, Now: func() time.Time { return now }}
	ctx := context.Background()
	if _, err := tr.Authenticate(ctx, "good", "a"); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := tr.Authenticate(ctx, "garbage", "a"); !errors.Is(err, auth.ErrUnauthenticated) {
			t.Fatalf("garbage token: %v", err)
		}
	}
	if got := calls.Load(); got != 2 {
		t.Fatalf("TokenReview calls = %d, want 2 (one for the good token, one for the garbage repeated 5 times)", got)
	}
	for i := range 100 { // far more distinct garbage than CacheSize
		_, _ = tr.Authenticate(ctx, fmt.Sprintf("garbage-%d", i), "a")
	}
	before := calls.Load()
	if _, err := tr.Authenticate(ctx, "good", "a"); err != nil || calls.Load() != before {
		t.Fatalf("good token after a garbage flood: err %v, reviewed again: %v", err, calls.Load() != before)
	}
	now = now.Add(11 * time.Second)
	tokens["garbage"] = tokens["good"] // now known to the API server
	if _, err := tr.Authenticate(ctx, "garbage", "a"); err != nil {
		t.Fatalf("a rejection outlived NegativeTTL: %v", err)
	}
}

// TestTokenReviewCachesUntilTokenExpiry: an accepted JWT is cached no longer
// than its exp claim.
func TestTokenReviewCachesUntilTokenExpiry(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	payload := base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"exp":%d}`, now.Add(time.Minute).Unix())))
	jwt := "eyJhbGciOiJSUzI1NiJ9." + payload + ".sig"
	var calls atomic.Int32
	tokens := map[string]token{jwt: {user: agentSA, node: "n1", audiences: []string{"fleetrepair"}}}
	tr := &auth.TokenReview{Clusters: map[string]kubernetes.Interface{"a": fakeCluster(tokens, &calls)}, TTL: time.Hour,
		Now: func() time.Time { return now }}
	for _, step := range []time.Duration{0, 30 * time.Second, 31 * time.Second} {
		now = now.Add(step)
		if _, err := tr.Authenticate(context.Background(), jwt, "a"); err != nil {
			t.Fatal(err)
		}
	}
	if got := calls.Load(); got != 2 {
		t.Fatalf("TokenReview calls = %d, want 2 (cached for 60 s of the token's life, then asked again)", got)
	}
}

func TestStaticToken(t *testing.T) {
	t.Parallel()
	s := auth.StaticToken{Token: "s3cret"}
	if id, err := s.Authenticate(context.Background(), "s3cret", "c1"); err != nil || auth.Authorize(id, "c1", "any-node") != nil {
		t.Fatalf("static token rejected: %v", err)
	}
	if _, err := s.Authenticate(context.Background(), "nope", "c1"); !errors.Is(err, auth.ErrUnauthenticated) {
		t.Fatalf("wrong token: %v", err)
	}
}

func TestLoadOperatorsErrors(t *testing.T) {
	t.Parallel()
	h := TokenHashForTest("t1")
	for name, tc := range map[string]struct{ doc, want string }{
		"bad role names the line":    {"- {name: a, role: admin, tokenSHA256: " + h + "}\n- {name: b, role: godmode, tokenSHA256: " + TokenHashForTest("t2") + "}\n", "line 2"},
		"unknown key names the line": {"- {name: a, role: admin, tokenSHA256: " + h + ", colour: red}\n", "line 1"},
		"empty file":                 {"", "no operators"},
		"duplicate name":             {"- {name: a, role: admin, tokenSHA256: " + h + "}\n- {name: a, role: viewer, tokenSHA256: " + TokenHashForTest("t2") + "}\n", "name given twice"},
		"short hash":                 {"- {name: a, role: admin, tokenSHA256: abc}\n", "64 hex"},
	} {
		p := filepath.Join(t.TempDir(), "operators.yaml")
		if err := os.WriteFile(p, []byte(tc.doc), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := auth.LoadOperators(p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to contain %q", name, err, tc.want)
		}
	}
}

// TokenHashForTest is auth.TokenHash.
func TokenHashForTest(s string) string { return auth.TokenHash(s) }
