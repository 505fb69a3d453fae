// Package karpentersim is a small simulated Karpenter for the demo and the
// tests: it builds a fleet of NodePools, NodeClaims and Nodes on any
// controller-runtime client (the client fakes, or a real kube-apiserver with
// the Karpenter CRDs), and replaces a deleted NodeClaim the way Karpenter
// does: after a delay it removes the old Node, finalizes the NodeClaim and
// launches a replacement NodeClaim and Node in the same NodePool and zone.
//
// It is test scaffolding, never linked into the controller's repair path.
package karpentersim

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/awslabs/operatorpkg/status"
	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// NodeSpec describes one simulated node.
type NodeSpec struct {
	Name         string
	NodePool     string
	Zone         string
	InstanceType string
	GPUs         int
	// Created, when set, is the objects' creation timestamp (the client
	// fakes keep it; a real API server sets its own).
	Created time.Time
	// Labels are extra labels of the Node and its NodeClaim (a rack, an
	// NVLink domain: the breakers' label cohorts).
	Labels map[string]string
}

// Replacement records one NodeClaim the simulator replaced.
type Replacement struct {
	OldNodeClaim, OldNode string
	NewNodeClaim, NewNode string
	At                    time.Time
}

// Sim is a simulated Karpenter on one cluster.
type Sim struct {
	c     client.Client
	delay time.Duration
	// OnReplace, when set, is called after each replacement.
	OnReplace func(Replacement)

	mu           sync.Mutex
	seen         map[string]time.Time // NodeClaim name -> when its deletion was first seen
	replacements []Replacement
	next         int
}

// New returns a simulator that replaces a deleted NodeClaim after delay.
func New(c client.Client, delay time.Duration) *Sim {
	return &Sim{c: c, delay: delay, seen: map[string]time.Time{}}
}

// CreateNodePool creates a NodePool with the given name.
func (s *Sim) CreateNodePool(ctx context.Context, name string) error {
	np := &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: name}}
	np.Spec.Template.Spec.NodeClassRef = &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"}
	np.Spec.Template.Spec.Requirements = []karpv1.NodeSelectorRequirementWithMinValues{{
		Key: corev1.LabelInstanceTypeStable, Operator: corev1.NodeSelectorOpExists}}
	if err := s.c.Create(ctx, np); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create nodepool %s: %w", name, err)
	}
	return nil
}

// CreateNode creates a NodeClaim (with Karpenter's termination finalizer)
// and its Ready Node, linked through status.nodeName and providerID.
func (s *Sim) CreateNode(ctx context.Context, n NodeSpec) error {
	ncName := n.Name + "-nc"
	providerID := "sim:///" + n.Zone + "/" + n.Name
	labels := map[string]string{
		karpv1.NodePoolLabelKey:          n.NodePool,
		corev1.LabelTopologyZone:         n.Zone,
		corev1.LabelInstanceTypeStable:   n.InstanceType,
		corev1.LabelHostname:             n.Name,
		"nvidia.com/gpu.count":           fmt.Sprint(n.GPUs),
		karpv1.NodeRegisteredLabelKey:    "true",
		karpv1.NodeInitializedLabelKey:   "true",
		"fleetrepair.dev/simulated-node": "true",
	}
	for k, v := range n.Labels {
		labels[k] = v
	}
	// A real API server assigns the UID itself; the client fakes keep the one
	// given here.
	nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: ncName, Labels: labels,
		UID: types.UID(uuid.NewString()), Finalizers: []string{karpv1.TerminationFinalizer}}}
	nc.Spec.NodeClassRef = &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"}
	nc.Spec.Requirements = []karpv1.NodeSelectorRequirementWithMinValues{{
		Key: corev1.LabelInstanceTypeStable, Operator: corev1.NodeSelectorOpIn, Values: []string{n.InstanceType}}}
	if err := s.c.Create(ctx, nc); err != nil {
		return fmt.Errorf("create nodeclaim %s: %w", ncName, err)
	}
	nc.Status.NodeName = n.Name
	nc.Status.ProviderID = providerID
	// Karpenter's lifecycle conditions of a NodeClaim whose Node came up:
	// launched, registered and initialized (controller/lifecycle reads them).
	for _, typ := range []string{karpv1.ConditionTypeLaunched, karpv1.ConditionTypeRegistered, karpv1.ConditionTypeInitialized} {
		nc.Status.Conditions = append(nc.Status.Conditions, status.Condition{Type: typ, Status: metav1.ConditionTrue,
			Reason: typ, LastTransitionTime: metav1.Now()})
	}
	if err := s.c.Status().Update(ctx, nc); err != nil {
		return fmt.Errorf("update nodeclaim %s status: %w", ncName, err)
	}
	gpus := resource.MustParse(fmt.Sprint(n.GPUs))
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: labels, UID: types.UID(uuid.NewString()),
			CreationTimestamp: metav1.NewTime(n.Created)},
		Spec: corev1.NodeSpec{ProviderID: providerID},
	}
	if err := s.c.Create(ctx, node); err != nil {
		return fmt.Errorf("create node %s: %w", n.Name, err)
	}
	node.Status = corev1.NodeStatus{
		Capacity:    corev1.ResourceList{"nvidia.com/gpu": gpus},
		Allocatable: corev1.ResourceList{"nvidia.com/gpu": gpus},
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			Reason: "KubeletReady", LastTransitionTime: metav1.Now(), LastHeartbeatTime: metav1.Now()}},
		NodeInfo: corev1.NodeSystemInfo{KernelVersion: "6.8.0-1015-aws", OSImage: "Amazon Linux 2023"},
	}
	if err := s.c.Status().Update(ctx, node); err != nil {
		return fmt.Errorf("update node %s status: %w", n.Name, err)
	}
	return nil
}

// Replacements returns the replacements made so far.
func (s *Sim) Replacements() []Replacement {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Replacement(nil), s.replacements...)
}

// Run polls NodeClaims every interval and replaces deleted ones until ctx
// ends. It returns nil on ctx cancellation.
func (s *Sim) Run(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := s.Step(ctx, time.Now()); err != nil && ctx.Err() == nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Step handles every NodeClaim that is being deleted and whose delay has
// passed at now.
func (s *Sim) Step(ctx context.Context, now time.Time) error {
	var list karpv1.NodeClaimList
	if err := s.c.List(ctx, &list); err != nil {
		return fmt.Errorf("list nodeclaims: %w", err)
	}
	for i := range list.Items {
		nc := &list.Items[i]
		if nc.DeletionTimestamp == nil {
			continue
		}
		s.mu.Lock()
		first, ok := s.seen[nc.Name]
		if !ok {
			first = now
			s.seen[nc.Name] = now
		}
		s.mu.Unlock()
		if now.Sub(first) < s.delay {
			continue
		}
		if err := s.replace(ctx, nc, now); err != nil {
			return err
		}
	}
	return nil
}

func (s *Sim) replace(ctx context.Context, nc *karpv1.NodeClaim, now time.Time) error {
	oldNode := nc.Status.NodeName
	var node corev1.Node
	spec := NodeSpec{NodePool: nc.Labels[karpv1.NodePoolLabelKey], Zone: nc.Labels[corev1.LabelTopologyZone],
		InstanceType: nc.Labels[corev1.LabelInstanceTypeStable], GPUs: 8}
	if err := s.c.Get(ctx, client.ObjectKey{Name: oldNode}, &node); err == nil {
		if q, ok := node.Status.Capacity["nvidia.com/gpu"]; ok {
			spec.GPUs = int(q.Value())
		}
		if err := s.c.Delete(ctx, &node); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete node %s: %w", oldNode, err)
		}
	}
	controllerutil.RemoveFinalizer(nc, karpv1.TerminationFinalizer)
	if err := s.c.Update(ctx, nc); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("finalize nodeclaim %s: %w", nc.Name, err)
	}
	s.mu.Lock()
	s.next++
	spec.Name = fmt.Sprintf("%s-r%d", spec.NodePool, s.next)
	spec.Created = now
	delete(s.seen, nc.Name)
	s.mu.Unlock()
	if err := s.CreateNode(ctx, spec); err != nil {
		return err
	}
	r := Replacement{OldNodeClaim: nc.Name, OldNode: oldNode, NewNodeClaim: spec.Name + "-nc", NewNode: spec.Name, At: now}
	s.mu.Lock()
	s.replacements = append(s.replacements, r)
	s.mu.Unlock()
	if s.OnReplace != nil {
		s.OnReplace(r)
	}
	return nil
}
