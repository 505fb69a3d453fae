// Package kube is fleetrepair's access to one Kubernetes cluster: Node
// metadata, NodeConditions, the quarantine taint, Events and Karpenter
// NodeClaims (karpenter.sh/v1). controller/repair is its only caller, which
// keeps every write to Kubernetes behind the repair guards and the ledger.
//
// It works on a controller-runtime client, so the same code runs against the
// client fakes (unit tests, the demo) and a real kube-apiserver. A cluster
// made by NewCached reads Nodes and NodeClaims from informers (cache.go)
// and writes straight to the API server; writes are guarded by UID
// preconditions and resource versions, so a stale cache costs a retry,
// never a wrong deletion.
package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/controller/lifecycle"
)

// QuarantineTaintKey is the NoSchedule taint fleetrepair puts on a node with
// a condition-severity diagnosis. It keeps new pods away; running pods stay
// until Karpenter drains the node on NodeClaim deletion.
const QuarantineTaintKey = "fleetrepair.dev/quarantine"

// EventSource is the reporting component on the Events fleetrepair writes.
const EventSource = "fleetrepair"

// Scheme is the runtime scheme with core/v1 and the Karpenter v1 types
// (registered into client-go's scheme by the karpenter package's init).
var Scheme = scheme.Scheme

// ErrNoNodeClaim is returned when no Karpenter NodeClaim owns a node.
var ErrNoNodeClaim = errors.New("no NodeClaim owns the node")

// ErrUIDChanged is returned when a NodeClaim's UID differs from the one the
// repair recorded: the object was replaced and must not be deleted.
var ErrUIDChanged = errors.New("NodeClaim UID changed")

// NodeInfo is what the controller needs to know about a node.
type NodeInfo struct {
	Name         string
	NodePool     string // karpenter.sh/nodepool label
	Zone         string // topology.kubernetes.io/zone label
	InstanceType string // node.kubernetes.io/instance-type label
	ProviderID   string
	NodeClaim    string    // name of the owning NodeClaim, "" when none
	NodeClaimUID types.UID // UID of the owning NodeClaim
	Ready        bool      // the kubelet's Ready condition is True
	Labels       map[string]string
	// Conditions are the node's status conditions, all writers included.
	Conditions []corev1.NodeCondition
	// KernelVersion and OSImage come from the kubelet's node info.
	KernelVersion string
	OSImage       string
	// Created is the Node object's creation time.
	Created time.Time
	// Taints are the keys of the Node's taints.
	Taints []string
	// Deleting is the Node's deletionTimestamp: zero while it is not being
	// deleted. A deleting node is leaving (Karpenter's termination
	// finalizer drains it): not capacity, not a breaker cohort member.
	Deleting time.Time
	// Claim holds the lifecycle facts of the owning NodeClaim (zero Name
	// when none owns the node); lifecycle.Classify turns them into a
	// lifecycle.State with the caller's clock (Lifecycle).
	Claim lifecycle.Facts
}

// Lifecycle classifies the node's NodeClaim at now (lifecycle.Classify); a
// node without a NodeClaim is active unless it is being deleted.
func (n NodeInfo) Lifecycle(now time.Time, g lifecycle.Graces) lifecycle.State {
	if n.Claim.Name == "" {
		if !n.Deleting.IsZero() {
			return lifecycle.Classify(lifecycle.Facts{Name: n.Name}, true, n.Deleting, now, g).State
		}
		return lifecycle.StateActive
	}
	return lifecycle.Classify(n.Claim, true, n.Deleting, now, g).State
}

func nodeInfo(n *corev1.Node) NodeInfo {
	info := NodeInfo{
		Name:          n.Name,
		NodePool:      n.Labels[karpv1.NodePoolLabelKey],
		Zone:          n.Labels[corev1.LabelTopologyZone],
		InstanceType:  n.Labels[corev1.LabelInstanceTypeStable],
		ProviderID:    n.Spec.ProviderID,
		Labels:        n.Labels,
		Conditions:    n.Status.Conditions,
		KernelVersion: n.Status.NodeInfo.KernelVersion,
		OSImage:       n.Status.NodeInfo.OSImage,
		Created:       n.CreationTimestamp.Time,
	}
	if n.DeletionTimestamp != nil {
		info.Deleting = n.DeletionTimestamp.Time
	}
	for _, t := range n.Spec.Taints {
		info.Taints = append(info.Taints, t.Key)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			info.Ready = c.Status == corev1.ConditionTrue
		}
	}
	return info
}

// Nodes returns every Node's metadata with its NodeClaim (NodeClaim,
// NodeClaimUID, Claim), joined from one NodeClaim list by status.nodeName,
// else providerID (the breakers' and the capacity view of the fleet: two
// lists, never one lookup per node).
func (k *Cluster) Nodes(ctx context.Context) ([]NodeInfo, error) {
	out, _, err := k.Fleet(ctx)
	return out, err
}

// Fleet returns every Node (as Nodes does) and the lifecycle facts of
// every NodeClaim, those without a Node included.
func (k *Cluster) Fleet(ctx context.Context) ([]NodeInfo, []lifecycle.Facts, error) {
	if err := k.synced(); err != nil {
		return nil, nil, err
	}
	// Read-only: the cache's own objects, not deep copies (every Node of
	// every cluster on each breaker evaluation: a fifth of the controller's
	// CPU at 100,000 nodes, docs/scale.md). nodeInfo keeps the Node's
	// Labels and Conditions by reference; nothing that receives a NodeInfo
	// writes to them, and the informer replaces an object on update rather
	// than changing it.
	var list corev1.NodeList
	if err := k.c.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, fmt.Errorf("list nodes: %w", err)
	}
	var ncs karpv1.NodeClaimList
	if err := k.c.List(ctx, &ncs, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, fmt.Errorf("list nodeclaims: %w", err)
	}
	claims := make([]lifecycle.Facts, 0, len(ncs.Items))
	byNode, byProvider := make(map[string]int, len(ncs.Items)), make(map[string]int, len(ncs.Items))
	for i := range ncs.Items {
		f := lifecycle.FactsOf(&ncs.Items[i])
		if f.NodeName != "" {
			byNode[f.NodeName] = len(claims)
		}
		if f.ProviderID != "" {
			byProvider[f.ProviderID] = len(claims)
		}
		claims = append(claims, f)
	}
	out := make([]NodeInfo, 0, len(list.Items))
	for i := range list.Items {
		info := nodeInfo(&list.Items[i])
		j, ok := byNode[info.Name]
		if !ok && info.ProviderID != "" {
			j, ok = byProvider[info.ProviderID]
		}
		if ok {
			info.Claim = claims[j]
			info.NodeClaim, info.NodeClaimUID = claims[j].Name, types.UID(claims[j].UID)
		}
		out = append(out, info)
	}
	return out, claims, nil
}

// NodeClaims classifies every NodeClaim of the cluster at now
// (lifecycle.Classify, with the existence and deletionTimestamp of its
// Node), Cluster set to the cluster's name.
func (k *Cluster) NodeClaims(ctx context.Context, now time.Time, g lifecycle.Graces) ([]lifecycle.Claim, error) {
	nodes, claims, err := k.Fleet(ctx)
	if err != nil {
		return nil, err
	}
	return ClassifyFleet(k.name, nodes, claims, now, g), nil
}

// ClassifyFleet classifies the NodeClaims of one cluster's Fleet at now.
func ClassifyFleet(cluster string, nodes []NodeInfo, claims []lifecycle.Facts, now time.Time, g lifecycle.Graces) []lifecycle.Claim {
	byName, byProvider := make(map[string]int, len(nodes)), make(map[string]int, len(nodes))
	for i := range nodes {
		byName[nodes[i].Name] = i
		if p := nodes[i].ProviderID; p != "" {
			byProvider[p] = i
		}
	}
	out := make([]lifecycle.Claim, 0, len(claims))
	for _, f := range claims {
		i, ok := byName[f.NodeName]
		if !ok && f.ProviderID != "" {
			i, ok = byProvider[f.ProviderID]
		}
		var deleting time.Time
		if ok {
			deleting = nodes[i].Deleting
		}
		c := lifecycle.Classify(f, ok, deleting, now, g)
		c.Cluster = cluster
		if c.Node == "" && ok {
			c.Node = nodes[i].Name
		}
		out = append(out, c)
	}
	return out
}

// NodeAddresses maps every address of every Node (status.addresses of
// type InternalIP and ExternalIP) to the Node's name: how a job's NCCL
// peer, printed as an address, is found (c29). An address two Nodes claim
// maps to neither.
func (k *Cluster) NodeAddresses(ctx context.Context) (map[string]string, error) {
	if err := k.synced(); err != nil {
		return nil, err
	}
	var list corev1.NodeList
	if err := k.c.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	out := make(map[string]string, len(list.Items))
	dup := map[string]bool{}
	for i := range list.Items {
		n := &list.Items[i]
		for _, a := range n.Status.Addresses {
			if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP || a.Address == "" {
				continue
			}
			if prev, ok := out[a.Address]; ok && prev != n.Name {
				dup[a.Address] = true
			}
			out[a.Address] = n.Name
		}
	}
	for a := range dup {
		delete(out, a)
	}
	return out, nil
}

// Cluster is one Kubernetes cluster.
type Cluster struct {
	name string
	c    client.Client
	// cached is set by NewCached: reads come from informers.
	cached *cached
}

// New returns a Cluster named name using c.
func New(name string, c client.Client) *Cluster { return &Cluster{name: name, c: c} }

// Name returns the cluster's name as the controller knows it.
func (k *Cluster) Name() string { return k.name }

// Client returns the underlying client (for the simulator and tests).
func (k *Cluster) Client() client.Client { return k.c }

// NodeInfo returns the node's metadata and its owning NodeClaim. It returns
// an error wrapping a NotFound API error when the node does not exist; a
// node without a NodeClaim is not an error (NodeClaim is empty).
func (k *Cluster) NodeInfo(ctx context.Context, node string) (NodeInfo, error) {
	if err := k.synced(); err != nil {
		return NodeInfo{}, err
	}
	var n corev1.Node
	if err := k.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		return NodeInfo{}, fmt.Errorf("get node %s: %w", node, err)
	}
	info := nodeInfo(&n)
	nc, err := k.nodeClaimFor(ctx, &n)
	switch {
	case errors.Is(err, ErrNoNodeClaim):
	case err != nil:
		return NodeInfo{}, err
	default:
		info.NodeClaim, info.NodeClaimUID = nc.Name, nc.UID
		info.Claim = lifecycle.FactsOf(nc)
	}
	return info, nil
}

// nodeClaimFor finds the NodeClaim whose status names the node (nodeName or
// providerID): through the cache's field indexes when the cluster is
// cached, else by listing the NodeClaims (client fakes without indexes).
func (k *Cluster) nodeClaimFor(ctx context.Context, n *corev1.Node) (*karpv1.NodeClaim, error) {
	var list karpv1.NodeClaimList
	if k.cached != nil {
		if err := k.c.List(ctx, &list, client.MatchingFields{IndexNodeClaimNodeName: n.Name}); err != nil {
			return nil, fmt.Errorf("list nodeclaims of node %s: %w", n.Name, err)
		}
		if len(list.Items) == 0 && n.Spec.ProviderID != "" {
			if err := k.c.List(ctx, &list, client.MatchingFields{IndexNodeClaimProviderID: n.Spec.ProviderID}); err != nil {
				return nil, fmt.Errorf("list nodeclaims of node %s: %w", n.Name, err)
			}
		}
	} else if err := k.c.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("list nodeclaims: %w", err)
	}
	for i := range list.Items {
		nc := &list.Items[i]
		if nc.Status.NodeName == n.Name || n.Spec.ProviderID != "" && nc.Status.ProviderID == n.Spec.ProviderID {
			return nc, nil
		}
	}
	return nil, fmt.Errorf("find nodeclaim for node %s: %w", n.Name, ErrNoNodeClaim)
}

// SetCondition sets one NodeCondition with a strategic-merge patch on the
// status subresource, keyed by condition type, so the kubelet's and other
// agents' conditions are never overwritten. LastTransitionTime changes only
// when the status does.
func (k *Cluster) SetCondition(ctx context.Context, node string, cond corev1.NodeCondition, now time.Time) error {
	var n corev1.Node
	if err := k.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		return fmt.Errorf("get node %s: %w", node, err)
	}
	cond.LastHeartbeatTime = metav1.NewTime(now)
	cond.LastTransitionTime = metav1.NewTime(now)
	for _, c := range n.Status.Conditions {
		if c.Type == cond.Type {
			if c.Status == cond.Status && c.Reason == cond.Reason && c.Message == cond.Message {
				return nil // unchanged: no write
			}
			if c.Status == cond.Status {
				cond.LastTransitionTime = c.LastTransitionTime
			}
		}
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}})
	if err != nil {
		return fmt.Errorf("encode condition patch: %w", err)
	}
	if err := k.c.Status().Patch(ctx, &n, client.RawPatch(types.StrategicMergePatchType, patch)); err != nil {
		return fmt.Errorf("patch node %s condition %s: %w", node, cond.Type, err)
	}
	return nil
}

// Condition returns the node's condition of type t, or false when absent.
func (k *Cluster) Condition(ctx context.Context, node string, t corev1.NodeConditionType) (corev1.NodeCondition, bool, error) {
	var n corev1.Node
	if err := k.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		return corev1.NodeCondition{}, false, fmt.Errorf("get node %s: %w", node, err)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == t {
			return c, true, nil
		}
	}
	return corev1.NodeCondition{}, false, nil
}

// taintBackoff retries a taint update that lost to another writer of the
// Node (the kubelet, other agents): up to 12 tries over about 4 s.
var taintBackoff = wait.Backoff{Steps: 12, Duration: 20 * time.Millisecond, Factor: 1.6, Jitter: 0.2}

// SetQuarantine adds (on) or removes (off) the NoSchedule quarantine taint,
// retrying on update conflicts. It is idempotent.
func (k *Cluster) SetQuarantine(ctx context.Context, node string, on bool, reason string) error {
	err := retry.RetryOnConflict(taintBackoff, func() error {
		var n corev1.Node
		if err := k.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return err
		}
		var taints []corev1.Taint
		has := false
		for _, t := range n.Spec.Taints {
			if t.Key == QuarantineTaintKey {
				has = true
				if !on {
					continue
				}
			}
			taints = append(taints, t)
		}
		if has == on {
			return nil
		}
		if on {
			taints = append(taints, corev1.Taint{Key: QuarantineTaintKey, Value: reason, Effect: corev1.TaintEffectNoSchedule})
		}
		n.Spec.Taints = taints
		return k.c.Update(ctx, &n)
	})
	if err != nil {
		return fmt.Errorf("set quarantine=%t on node %s: %w", on, node, err)
	}
	return nil
}

// Quarantined reports whether the node carries the quarantine taint.
func (k *Cluster) Quarantined(ctx context.Context, node string) (bool, error) {
	var n corev1.Node
	if err := k.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		return false, fmt.Errorf("get node %s: %w", node, err)
	}
	for _, t := range n.Spec.Taints {
		if t.Key == QuarantineTaintKey {
			return true, nil
		}
	}
	return false, nil
}

// RecordEvent writes a core/v1 Event about the node. key makes the Event name
// deterministic, so the same fact recorded twice (a controller restart, a
// second replica) is one Event: AlreadyExists is success.
func (k *Cluster) RecordEvent(ctx context.Context, node, eventType, reason, message, key string, now time.Time) error {
	sum := sha256.Sum256([]byte(node + "\x00" + reason + "\x00" + key))
	ev := &corev1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: node + ".fr-" + hex.EncodeToString(sum[:8]), Namespace: metav1.NamespaceDefault},
		InvolvedObject:      corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node), APIVersion: "v1"},
		Reason:              reason,
		Message:             message,
		Type:                eventType,
		Source:              corev1.EventSource{Component: EventSource},
		ReportingController: "fleetrepair.dev/controller",
		ReportingInstance:   EventSource,
		FirstTimestamp:      metav1.NewTime(now),
		LastTimestamp:       metav1.NewTime(now),
		Count:               1,
	}
	if err := k.c.Create(ctx, ev); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create event %s on node %s: %w", reason, node, err)
	}
	return nil
}

// DeleteNodeClaim deletes the NodeClaim with a UID precondition, so a
// NodeClaim that was replaced under the same name is never deleted by
// mistake. Karpenter then drains the node gracefully and launches a
// replacement. NotFound and an object already being deleted count as
// success; issued is true only when this call sent the delete. It returns
// ErrUIDChanged when the live object has another UID.
func (k *Cluster) DeleteNodeClaim(ctx context.Context, name string, uid types.UID) (issued bool, err error) {
	var nc karpv1.NodeClaim
	var r client.Reader = k.c
	if k.cached != nil {
		r = k.cached.direct // the cache may not show our own delete yet: read the API server
	}
	if err := r.Get(ctx, client.ObjectKey{Name: name}, &nc); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("get nodeclaim %s: %w", name, err)
	}
	if nc.UID != uid {
		return false, fmt.Errorf("delete nodeclaim %s: recorded uid %s, live uid %s: %w", name, uid, nc.UID, ErrUIDChanged)
	}
	if nc.DeletionTimestamp != nil {
		return false, nil // already deleting
	}
	err = k.c.Delete(ctx, &nc, client.Preconditions{UID: &uid})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	case apierrors.IsConflict(err):
		return false, fmt.Errorf("delete nodeclaim %s: %w: %w", name, ErrUIDChanged, err)
	}
	return false, fmt.Errorf("delete nodeclaim %s: %w", name, err)
}

// NodeClaimGone reports whether the NodeClaim with that name and UID no
// longer exists (deleted, or replaced by another object of the same name).
func (k *Cluster) NodeClaimGone(ctx context.Context, name string, uid types.UID) (bool, error) {
	var nc karpv1.NodeClaim
	if err := k.c.Get(ctx, client.ObjectKey{Name: name}, &nc); err != nil {
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, fmt.Errorf("get nodeclaim %s: %w", name, err)
	}
	return nc.UID != uid, nil
}
