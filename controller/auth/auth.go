// Package auth authenticates node agents (DESIGN.md, decision 10).
//
// In production an agent presents a projected ServiceAccount token minted for
// the fleetrepair audience. The controller validates it with a TokenReview
// against the agent's own cluster; the token is bound to the agent's pod, and
// Kubernetes (>= 1.30) puts the pod's node in the review's extra
// "authentication.kubernetes.io/node-name", so an agent may report only for
// its own node. Results are cached briefly so every report does not cost an
// API call. A static-token mode exists for demos and development.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

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
type TokenReview struct {
	// Clusters maps a cluster name to a client of its API server.
	Clusters map[string]kubernetes.Interface
	// Audience the tokens must carry (default DefaultAudience).
	Audience string
	// ServiceAccounts, when set, are the only subjects accepted
	// ("system:serviceaccount:<namespace>:<name>").
	ServiceAccounts []string
	// TTL of a cached positive review (default 30s); rejections are not cached.
	TTL time.Duration
	Now func() time.Time

	mu    sync.Mutex
	cache map[[32]byte]cached
}

type cached struct {
	id      Identity
	expires time.Time
}

const maxCache = 10000

// Authenticate implements Authenticator.
func (t *TokenReview) Authenticate(ctx context.Context, token, cluster string) (Identity, error) {
	if token == "" {
		return Identity{}, fmt.Errorf("no bearer token: %w", ErrUnauthenticated)
	}
	now := time.Now
	if t.Now != nil {
		now = t.Now
	}
	key := sha256.Sum256([]byte(cluster + "\x00" + token))
	t.mu.Lock()
	if c, ok := t.cache[key]; ok && now().Before(c.expires) {
		t.mu.Unlock()
		return c.id, nil
	}
	t.mu.Unlock()

	cs, ok := t.Clusters[cluster]
	if !ok {
		return Identity{}, fmt.Errorf("cluster %q is not served here: %w", cluster, ErrForbidden)
	}
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
	id := Identity{Cluster: cluster, Node: nodes[0], Subject: st.User.Username}
	ttl := t.TTL
	if ttl <= 0 {
		ttl = 30 * time.Second
	}
	t.mu.Lock()
	if t.cache == nil || len(t.cache) >= maxCache {
		t.cache = map[[32]byte]cached{} // bounded: start over rather than grow
	}
	t.cache[key] = cached{id: id, expires: now().Add(ttl)}
	t.mu.Unlock()
	return id, nil
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
