package kube

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// Client-side rate limits of a cluster's API client (CachedOptions
// defaults). Reads come from the informer cache, so the limiter only meters
// writes (condition patches, taint updates, Events, NodeClaim deletes) and
// the informers' initial lists and watches. client-go's own default (QPS 5,
// burst 10) held the reconciler to about one node per second on 1,000
// nodes (issue 9); at 50/100 the load harness measured repairs of a
// 1,500-node wave opening at about 20 per second (three writes per node).
// 200/300 are Karpenter's own defaults (KUBE_CLIENT_QPS, KUBE_CLIENT_BURST)
// for the controller that shares these API servers with us; the API
// server's Priority and Fairness still protects it.
const (
	DefaultQPS   = 200
	DefaultBurst = 300
	// DefaultRequestTimeout bounds one API request, so a dead API server
	// costs a reconcile seconds, not a TCP timeout.
	DefaultRequestTimeout = 15 * time.Second
)

// Field indexes on NodeClaims in the cache: a node's NodeClaim is found by
// the node's name or provider ID without listing every NodeClaim.
const (
	IndexNodeClaimNodeName   = "status.nodeName"
	IndexNodeClaimProviderID = "status.providerID"
)

// ErrNotSynced is returned while a cached cluster's informers have not
// completed their first list: its nodes are unknown.
var ErrNotSynced = errors.New("cluster cache not synced")

// CachedOptions configure NewCached. Zero values take the defaults above.
type CachedOptions struct {
	QPS            float32
	Burst          int
	RequestTimeout time.Duration
}

// NewCached returns a Cluster whose reads (Nodes, NodeClaims) come from a
// controller-runtime informer cache with NodeClaim field indexes, and whose
// writes go straight to the API server through cfg with the client-side
// limits of o. Call Run to start the informers; until they synced, reads
// fail with ErrNotSynced. cfg is copied, not modified.
func NewCached(name string, cfg *rest.Config, o CachedOptions) (*Cluster, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst, cfg.Timeout = o.QPS, o.Burst, o.RequestTimeout
	if cfg.QPS == 0 {
		cfg.QPS = DefaultQPS
	}
	if cfg.Burst == 0 {
		cfg.Burst = DefaultBurst
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultRequestTimeout
	}
	mapper, err := restMapper(cfg)
	if err != nil {
		return nil, fmt.Errorf("build cache for cluster %s: %w", name, err)
	}
	// The informers get no client-side Timeout: rest.Config.Timeout is the
	// http.Client's, which also ends a watch's response body, so every
	// watch was cut after RequestTimeout and re-opened, and a first
	// (streamed) list of more Nodes than the API server can send in that time
	// started over and over (docs/design.md, "Informer wire format and
	// timeouts"). Watches are bounded by their server-side timeoutSeconds
	// (5-10 min) and a dead server is found by the transport's HTTP/2 health
	// check and Probe. Built-in types (Nodes) travel as protobuf, CRDs
	// (NodeClaims, NodePools) as JSON: controller-runtime's choice when
	// ContentType is unset, checked by TestRealAPIServer/CacheWireFormats.
	icfg := rest.CopyConfig(cfg)
	icfg.Timeout = 0
	ca, err := cache.New(icfg, cache.Options{Scheme: Scheme, Mapper: mapper, ReaderFailOnMissingInformer: true,
		DefaultTransform: stripForCache})
	if err != nil {
		return nil, fmt.Errorf("build cache for cluster %s: %w", name, err)
	}
	ctx := context.Background() // IndexField and GetInformer do not block before Start, nor call the API server (restMapper)
	if err := ca.IndexField(ctx, &karpv1.NodeClaim{}, IndexNodeClaimNodeName, func(o client.Object) []string {
		if n := o.(*karpv1.NodeClaim).Status.NodeName; n != "" {
			return []string{n}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("index nodeclaims by node name: %w", err)
	}
	if err := ca.IndexField(ctx, &karpv1.NodeClaim{}, IndexNodeClaimProviderID, func(o client.Object) []string {
		if p := o.(*karpv1.NodeClaim).Status.ProviderID; p != "" {
			return []string{p}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("index nodeclaims by provider id: %w", err)
	}
	nodes, err := ca.GetInformer(ctx, &corev1.Node{}, cache.BlockUntilSynced(false))
	if err != nil {
		return nil, fmt.Errorf("node informer: %w", err)
	}
	claims, err := ca.GetInformer(ctx, &karpv1.NodeClaim{}, cache.BlockUntilSynced(false))
	if err != nil {
		return nil, fmt.Errorf("nodeclaim informer: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: Scheme, Mapper: mapper, Cache: &client.CacheOptions{Reader: ca}})
	if err != nil {
		return nil, fmt.Errorf("build client for cluster %s: %w", name, err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("build discovery client for cluster %s: %w", name, err)
	}
	direct, err := client.New(cfg, client.Options{Scheme: Scheme, Mapper: mapper})
	if err != nil {
		return nil, fmt.Errorf("build direct client for cluster %s: %w", name, err)
	}
	k := New(name, c)
	k.cached = &cached{cache: ca, nodes: nodes, claims: claims, probe: disc.RESTClient(), direct: direct}
	return k, nil
}

// cached is the informer side of a cached Cluster.
type cached struct {
	cache         cache.Cache
	nodes, claims cache.Informer
	probe         rest.Interface
	// direct reads from the API server, where a cache that lags behind our
	// own write would make us repeat it (the NodeClaim read before delete).
	direct client.Reader
}

// stripForCache drops what the controller never reads from cached objects
// (managed fields, the node's container image list: about half of a GPU
// Node's bytes), so 10,000 Nodes stay small in memory.
func stripForCache(obj any) (any, error) {
	if o, ok := obj.(client.Object); ok {
		o.SetManagedFields(nil)
	}
	if n, ok := obj.(*corev1.Node); ok {
		n.Status.Images = nil
	}
	return obj, nil
}

// Cached reports whether reads come from an informer cache.
func (k *Cluster) Cached() bool { return k.cached != nil }

// Run starts the informers of a cached cluster and calls onChange with a
// node's name whenever something the reconciler acts on changes: a Node
// added or deleted, its conditions (type, status, reason, message) or taints
// changed, a NodeClaim deleted, marked for deletion, or bound to a node.
// Heartbeat-only updates of a condition enqueue nothing. It blocks until ctx
// ends and returns nil then. For an uncached cluster it returns nil at once.
func (k *Cluster) Run(ctx context.Context, onChange func(node string)) error {
	if k.cached == nil {
		return nil
	}
	if onChange != nil {
		if _, err := k.cached.nodes.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: func(o any) {
				if n, ok := o.(*corev1.Node); ok {
					onChange(n.Name)
				}
			},
			UpdateFunc: func(oldObj, newObj any) {
				o, ok1 := oldObj.(*corev1.Node)
				n, ok2 := newObj.(*corev1.Node)
				if ok1 && ok2 && nodeChanged(o, n) {
					onChange(n.Name)
				}
			},
			DeleteFunc: func(o any) {
				if n, ok := deletedObject(o).(*corev1.Node); ok {
					onChange(n.Name)
				}
			},
		}); err != nil {
			return fmt.Errorf("watch nodes of cluster %s: %w", k.name, err)
		}
		if _, err := k.cached.claims.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			UpdateFunc: func(oldObj, newObj any) {
				o, ok1 := oldObj.(*karpv1.NodeClaim)
				n, ok2 := newObj.(*karpv1.NodeClaim)
				if !ok1 || !ok2 || n.Status.NodeName == "" {
					return
				}
				if o.Status.NodeName != n.Status.NodeName || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) {
					onChange(n.Status.NodeName)
				}
			},
			DeleteFunc: func(o any) {
				if nc, ok := deletedObject(o).(*karpv1.NodeClaim); ok && nc.Status.NodeName != "" {
					onChange(nc.Status.NodeName)
				}
			},
		}); err != nil {
			return fmt.Errorf("watch nodeclaims of cluster %s: %w", k.name, err)
		}
	}
	if err := k.cached.cache.Start(ctx); err != nil {
		return fmt.Errorf("run cache of cluster %s: %w", k.name, err)
	}
	return nil
}

// deletedObject is the object of a delete event: the last state the
// informer knew when the watch missed the delete itself (a tombstone).
func deletedObject(o any) any {
	if tomb, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		return tomb.Obj
	}
	return o
}

// nodeChanged reports whether an update changed what a reconcile reads:
// taints, labels the cohorts use, the provider ID, or any condition's type,
// status, reason or message (not its heartbeat or transition times).
func nodeChanged(o, n *corev1.Node) bool {
	if !equality.Semantic.DeepEqual(o.Spec.Taints, n.Spec.Taints) || o.Spec.ProviderID != n.Spec.ProviderID ||
		!equality.Semantic.DeepEqual(o.Labels, n.Labels) || len(o.Status.Conditions) != len(n.Status.Conditions) {
		return true
	}
	type key struct{ status, reason, message string }
	old := make(map[corev1.NodeConditionType]key, len(o.Status.Conditions))
	for _, c := range o.Status.Conditions {
		old[c.Type] = key{string(c.Status), c.Reason, c.Message}
	}
	for _, c := range n.Status.Conditions {
		if prev, ok := old[c.Type]; !ok || prev != (key{string(c.Status), c.Reason, c.Message}) {
			return true
		}
	}
	return false
}

// Probe checks that the cluster's API server answers (GET /readyz, which
// every authenticated user may read) and, for a cached cluster, that its
// informers have synced. It returns nil for an uncached cluster: its reads
// go to the API server and report reachability themselves.
func (k *Cluster) Probe(ctx context.Context) error {
	if k.cached == nil {
		return nil
	}
	if err := k.cached.probe.Get().AbsPath("/readyz").Do(ctx).Error(); err != nil {
		return fmt.Errorf("probe api server of cluster %s: %w", k.name, err)
	}
	return k.synced()
}

// WaitSynced blocks until a cached cluster's informers completed their
// first list (true; Run must be running or be started) or ctx ends (false).
// It returns true at once for an uncached cluster.
func (k *Cluster) WaitSynced(ctx context.Context) bool {
	if k.cached == nil {
		return true
	}
	return k.cached.cache.WaitForCacheSync(ctx)
}

// synced returns ErrNotSynced until every informer completed its first list.
func (k *Cluster) synced() error {
	if k.cached == nil || k.cached.nodes.HasSynced() && k.cached.claims.HasSynced() {
		return nil
	}
	return fmt.Errorf("cluster %s: %w", k.name, ErrNotSynced)
}
