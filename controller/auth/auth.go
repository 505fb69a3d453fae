// Package auth authenticates node agents (docs/design.md, decision 10).
//
// In production an agent presents a projected ServiceAccount token minted for
// the fleetrepair audience. The controller validates it with a TokenReview
// against the agent's own cluster; the token is bound to the agent's pod, and
// Kubernetes (>= 1.30) puts the pod's node in the review's extra
// "authentication.kubernetes.io/node-name", so an agent may report only for
// its own node. Reviews are cached both ways in bounded LRUs, so every report
// does not cost an API call and a flood of bad tokens cannot starve good ones. A static-token mode exists for demos and development.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"
	"golang.org/x/sync/singleflight"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Errors map to HTTP statuses: ErrUnauthenticated 401, ErrForbidden 403.
var (
	ErrUnauthenticated = errors.New("unauthenticated")
	ErrForbidden       = errors.New("forbidden")
)

// NodeNameExtra is the TokenReview user extra that names the node of the pod
// a bound ServiceAccount token was minted for.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// DefaultAudience is the token audience agents request.
const DefaultAudience = "fleetrepair"

// Identity is an authenticated agent.
type Identity struct {
	Cluster string
	// Node is the node the credential is bound to; "" means any node
	// (static-token mode only).
	Node    string
	Subject string // e.g. system:serviceaccount:fleetrepair:fleetrepair-agent
}

// Authenticator checks an agent's bearer token for a report that claims
// cluster. It returns an error wrapping ErrUnauthenticated or ErrForbidden
// with the reason.
type Authenticator interface {
	Authenticate(ctx context.Context, token, cluster string) (Identity, error)
}

// StaticToken accepts one shared token for every cluster and node (demo and
// development mode only: it cannot bind an agent to its node).
type StaticToken struct{ Token string }

// Authenticate implements Authenticator.
func (s StaticToken) Authenticate(_ context.Context, token, cluster string) (Identity, error) {
	if token == "" {
		return Identity{}, fmt.Errorf("no bearer token: %w", ErrUnauthenticated)
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(s.Token)) != 1 {
		return Identity{}, fmt.Errorf("wrong static token: %w", ErrUnauthenticated)
	}
	return Identity{Cluster: cluster, Subject: "static-token"}, nil
}

// TokenReview validates projected ServiceAccount tokens against each
// cluster's API server.
//
// Results are cached both ways, keyed by the SHA-256 of (cluster, token), so
// no token is ever held in memory beyond the request: an accepted token until
// the earlier of its own expiry (the JWT "exp" claim, read only after the API
// server accepted it) and TTL; a rejected one for NegativeTTL, so a flood of
// the same garbage token costs one TokenReview per NegativeTTL. Both caches
// are bounded LRUs (hashicorp/golang-lru expirable): a flood of distinct
// garbage tokens evicts rejected entries only, never the accepted ones.
// Concurrent reviews of one token are collapsed into one call, and each call
// has a deadline (ReviewTimeout), so a backlog behind the client's rate
// limiter turns into quick 503s the agent retries, never into minutes of
// queued reviews. Limits per source come before this (web/api).
type TokenReview struct {
	// Clusters maps a cluster name to a client of its API server. Give each
	// client its own QPS/burst (cmd/fleetrepair sets 100/200, apart from the
	// reconciler's client): client-go's default of 5/10 serves about 150
	// agents re-authenticating every 30 s. Change it after the first
	// Authenticate only through SetCluster and RemoveCluster.
	Clusters map[string]kubernetes.Interface
	// Audience the tokens must carry (default DefaultAudience).
	Audience string
	// ServiceAccounts, when set, are the only subjects accepted
	// ("system:serviceaccount:<namespace>:<name>").
	ServiceAccounts []string
	// TTL bounds how long an accepted review is cached (default
	// DefaultReviewTTL); a token expiring sooner is cached until it expires.
	TTL time.Duration
	// NegativeTTL is how long a rejected token is answered from the cache
	// (default DefaultNegativeTTL). Short, so a token the API server did not
	// know yet (clock skew, a just-created ServiceAccount) is asked again soon.
	NegativeTTL time.Duration
	// CacheSize bounds each cache in entries (default DefaultCacheSize).
	CacheSize int
	// ReviewTimeout bounds one TokenReview call, client-side rate-limiter
	// wait included (default DefaultReviewTimeout).
	ReviewTimeout time.Duration
	Now           func() time.Time

	once     sync.Once
	mu       sync.RWMutex // guards Clusters
	accepted *expirable.LRU[[32]byte, cached]
	rejected *expirable.LRU[[32]byte, cachedErr]
	flight   singleflight.Group
}

// SetCluster makes tokens claiming cluster be reviewed by cs from now on (a
// cluster picked up at run time, or its rotated credential).
func (t *TokenReview) SetCluster(cluster string, cs kubernetes.Interface) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.Clusters == nil {
		t.Clusters = map[string]kubernetes.Interface{}
	}
	t.Clusters[cluster] = cs
}

// RemoveCluster stops reviewing tokens of cluster. Its cached reviews
// accept nothing from then on (Authenticate looks the cluster up before
// the cache) and age out of the LRU.
func (t *TokenReview) RemoveCluster(cluster string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.Clusters, cluster)
}

// Defaults of TokenReview.
const (
	DefaultReviewTTL     = 5 * time.Minute
	DefaultNegativeTTL   = 10 * time.Second
	DefaultCacheSize     = 65536 // > 10,000 agents with room for rotation overlap
	DefaultReviewTimeout = 5 * time.Second
)

type cached struct {
	id      Identity
	expires time.Time
}

type cachedErr struct {
	err     error
	expires time.Time
}

func (t *TokenReview) init() {
	t.once.Do(func() {
		size := t.CacheSize
		if size <= 0 {
			size = DefaultCacheSize
		}
		ttl, nttl := t.TTL, t.NegativeTTL
		if ttl <= 0 {
			ttl = DefaultReviewTTL
		}
		if nttl <= 0 {
			nttl = DefaultNegativeTTL
		}
		t.TTL, t.NegativeTTL = ttl, nttl
		// The LRUs' own TTL is a backstop on the wall clock; entries carry
		// their expiry on t.Now, which decides.
		t.accepted = expirable.NewLRU[[32]byte, cached](size, nil, ttl)
		t.rejected = expirable.NewLRU[[32]byte, cachedErr](size, nil, nttl)
	})
}

// CacheKey is the cache key of token for cluster: SHA-256 over both, so the
// caches never hold a token.
func CacheKey(cluster, token string) [32]byte {
	return sha256.Sum256([]byte(cluster + "\x00" + token))
}

// Cached reports whether an accepted review of token for cluster is cached
// (web/api lets such requests past its per-source limit on unverified
// tokens).
func (t *TokenReview) Cached(token, cluster string) bool {
	t.init()
	c, ok := t.accepted.Peek(CacheKey(cluster, token))
	return ok && t.now().Before(c.expires)
}

func (t *TokenReview) now() time.Time {
	if t.Now != nil {
		return t.Now()
	}
	return time.Now()
}

// Authenticate implements Authenticator. A cluster this controller does not
// serve cannot authenticate anything: the answer is ErrUnauthenticated, the
// same as for a bad token, and names no served cluster.
func (t *TokenReview) Authenticate(ctx context.Context, token, cluster string) (Identity, error) {
	if token == "" {
		return Identity{}, fmt.Errorf("no bearer token: %w", ErrUnauthenticated)
	}
	t.init()
	// The cluster is looked up first, so a removed cluster's cached reviews
	// accept nothing (RemoveCluster).
	t.mu.RLock()
	cs, ok := t.Clusters[cluster]
	t.mu.RUnlock()
	if !ok {
		return Identity{}, fmt.Errorf("no credential of the claimed cluster can be verified here: %w", ErrUnauthenticated)
	}
	now := t.now()
	key := CacheKey(cluster, token)
	if c, ok := t.accepted.Get(key); ok && now.Before(c.expires) {
		return c.id, nil
	}
	if c, ok := t.rejected.Get(key); ok && now.Before(c.expires) {
		return Identity{}, c.err
	}
	v, err, _ := t.flight.Do(string(key[:]), func() (any, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.reviewTimeout())
		defer cancel()
		id, err := t.review(rctx, cs, token, cluster)
		switch {
		case err == nil:
			exp := now.Add(t.TTL)
			if te, ok := jwtExpiry(token); ok && te.Before(exp) {
				exp = te
			}
			t.accepted.Add(key, cached{id: id, expires: exp})
			t.rejected.Remove(key)
		case errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrForbidden):
			// Only the API server's verdict is cached, never a failed call.
			t.rejected.Add(key, cachedErr{err: err, expires: now.Add(t.NegativeTTL)})
		}
		return id, err
	})
	id, _ := v.(Identity)
	return id, err
}

func (t *TokenReview) reviewTimeout() time.Duration {
	if t.ReviewTimeout > 0 {
		return t.ReviewTimeout
	}
	return DefaultReviewTimeout
}

// review asks cluster's API server about token.
func (t *TokenReview) review(ctx context.Context, cs kubernetes.Interface, token, cluster string) (Identity, error) {
	aud := t.Audience
	if aud == "" {
		aud = DefaultAudience
	}
	tr, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: []string{aud}}}, metav1.CreateOptions{})
	if err != nil {
		return Identity{}, fmt.Errorf("token review against cluster %s: %w", cluster, err)
	}
	st := tr.Status
	switch {
	case !st.Authenticated:
		reason := st.Error
		if reason == "" {
			reason = "not authenticated"
		}
		return Identity{}, fmt.Errorf("cluster %s rejected the token (%s): %w", cluster, reason, ErrUnauthenticated)
	case !slices.Contains(st.Audiences, aud):
		return Identity{}, fmt.Errorf("token audiences %v do not include %q: %w", st.Audiences, aud, ErrUnauthenticated)
	case len(t.ServiceAccounts) > 0 && !slices.Contains(t.ServiceAccounts, st.User.Username):
		return Identity{}, fmt.Errorf("subject %s is not an agent service account: %w", st.User.Username, ErrForbidden)
	}
	nodes := st.User.Extra[NodeNameExtra]
	if len(nodes) != 1 || nodes[0] == "" {
		return Identity{}, fmt.Errorf("token of %s is not bound to a pod on a node (use a projected ServiceAccount token): %w", st.User.Username, ErrForbidden)
	}
	return Identity{Cluster: cluster, Node: nodes[0], Subject: st.User.Username}, nil
}

// jwtExpiry reads the "exp" claim of a JWT without verifying it: call it only
// on a token the API server accepted, to cache it no longer than it lives.
func jwtExpiry(token string) (time.Time, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *int64 `json:"exp"`
	}
	if json.Unmarshal(b, &claims) != nil || claims.Exp == nil {
		return time.Time{}, false
	}
	return time.Unix(*claims.Exp, 0), true
}

// Authorize checks that id may report for node in cluster. It returns an
// error wrapping ErrForbidden with the reason.
func Authorize(id Identity, cluster, node string) error {
	if id.Cluster != cluster {
		return fmt.Errorf("credential of cluster %s used for cluster %s: %w", id.Cluster, cluster, ErrForbidden)
	}
	if id.Node != "" && id.Node != node {
		return fmt.Errorf("credential bound to node %s used to report for node %s (an agent reports only for its own node): %w", id.Node, node, ErrForbidden)
	}
	return nil
}
