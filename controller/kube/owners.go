package kube

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/controller/decide"
)

// podNodeNameField is the Pod field the API server selects on to list the
// Pods bound to a node.
const podNodeNameField = "spec.nodeName"

// Disruption reads what the node's owners said about disrupting it
// (decide.Disruption, docs/design.md "Do-not-disrupt and opt-out"): the
// opt-out label (decide.OptOutLabel=disabled) on the Node or its NodePool,
// and karpenter.sh/do-not-disrupt on the Node, its NodeClaim or an active
// Pod bound to it (not terminal, not terminating: Karpenter's IsActive),
// read at now (a Pod's duration value counts from its start time). The
// first holder found is named ("Node n1", "NodePool gpu", "NodeClaim
// n1-x", "Pod ns/name").
//
// It runs only at a deletion guard, so a cached cluster keeps no Pod or
// NodePool informer (10,000 nodes' Pods would dwarf the Node cache): the
// NodePool and the node's Pods (field selector spec.nodeName) are read
// from the API server. An uncached cluster (the client fakes) lists every
// Pod and filters. A NodePool that does not exist opts nothing out. Errors
// are the API reads', wrapped; the caller retries on the next pass, never
// deletes on a failed read.
func (k *Cluster) Disruption(ctx context.Context, info NodeInfo, now time.Time) (decide.Disruption, error) {
	var d decide.Disruption
	var n corev1.Node
	if err := k.c.Get(ctx, client.ObjectKey{Name: info.Name}, &n); err != nil {
		return d, fmt.Errorf("get node %s: %w", info.Name, err)
	}
	var r client.Reader = k.c
	if k.cached != nil {
		r = k.cached.direct
	}
	if decide.OptedOut(n.Labels) {
		d.OptOut = "Node " + n.Name
	} else if pool := n.Labels[karpv1.NodePoolLabelKey]; pool != "" {
		var np karpv1.NodePool
		switch err := r.Get(ctx, client.ObjectKey{Name: pool}, &np); {
		case apierrors.IsNotFound(err):
		case err != nil:
			return d, fmt.Errorf("get nodepool %s: %w", pool, err)
		case decide.OptedOut(np.Labels):
			d.OptOut = "NodePool " + pool
		}
	}
	if decide.ObjectDoNotDisrupt(n.Annotations) {
		d.DoNotDisrupt = "Node " + n.Name
		return d, nil
	}
	if info.NodeClaim != "" {
		var nc karpv1.NodeClaim
		switch err := k.c.Get(ctx, client.ObjectKey{Name: info.NodeClaim}, &nc); {
		case apierrors.IsNotFound(err):
		case err != nil:
			return d, fmt.Errorf("get nodeclaim %s: %w", info.NodeClaim, err)
		case decide.ObjectDoNotDisrupt(nc.Annotations):
			d.DoNotDisrupt = "NodeClaim " + nc.Name
			return d, nil
		}
	}
	var pods corev1.PodList
	var opts []client.ListOption
	if k.cached != nil {
		opts = append(opts, client.MatchingFields{podNodeNameField: n.Name})
	}
	if err := r.List(ctx, &pods, opts...); err != nil {
		return d, fmt.Errorf("list pods of node %s: %w", n.Name, err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != n.Name || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		v, ok := p.Annotations[decide.DoNotDisruptAnnotation]
		if !ok {
			continue
		}
		var started time.Time
		if p.Status.StartTime != nil {
			started = p.Status.StartTime.Time
		}
		if decide.PodDoNotDisrupt(v, started, now) {
			d.DoNotDisrupt = "Pod " + p.Namespace + "/" + p.Name
			return d, nil
		}
	}
	return d, nil
}
