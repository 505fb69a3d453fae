package kube

import (
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/karpenter/pkg/apis"
)

// restMapper maps the kinds fleetrepair reads and writes without asking
// the API server, and any other kind through controller-runtime's lazy
// discovery mapper. Building a cluster's cache and clients therefore never
// calls the API server: a cluster that is down at start is reported
// unreachable by the periodic pass's probe, and every other cluster is
// served (before, the informers' discovery failed the whole controller's
// start).
func restMapper(cfg *rest.Config) (meta.RESTMapper, error) {
	karpenter := schema.GroupVersion{Group: apis.Group, Version: "v1"}
	static := meta.NewDefaultRESTMapper(nil)
	for _, k := range []struct {
		gvk   schema.GroupVersionKind
		scope meta.RESTScope
	}{
		{corev1.SchemeGroupVersion.WithKind("Node"), meta.RESTScopeRoot},
		{corev1.SchemeGroupVersion.WithKind("Pod"), meta.RESTScopeNamespace},
		{corev1.SchemeGroupVersion.WithKind("Event"), meta.RESTScopeNamespace},
		{eventsv1.SchemeGroupVersion.WithKind("Event"), meta.RESTScopeNamespace},
		{coordinationv1.SchemeGroupVersion.WithKind("Lease"), meta.RESTScopeNamespace},
		{karpenter.WithKind("NodeClaim"), meta.RESTScopeRoot},
		{karpenter.WithKind("NodePool"), meta.RESTScopeRoot},
	} {
		static.Add(k.gvk, k.scope)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("build http client: %w", err)
	}
	dynamic, err := apiutil.NewDynamicRESTMapper(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("build rest mapper: %w", err)
	}
	// The first mapper that knows a kind answers (a MultiRESTMapper would
	// find a known kind twice and call it ambiguous).
	return meta.FirstHitRESTMapper{MultiRESTMapper: meta.MultiRESTMapper{static, dynamic}}, nil
}
