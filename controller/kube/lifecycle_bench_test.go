package kube

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/lifecycle"
)

// BenchmarkClassifyFleet classifies the NodeClaims of a 10,000-node cluster
// (every periodic pass does, per cluster): one join by node name, a few by
// providerID, and claims without a Node.
func BenchmarkClassifyFleet(b *testing.B) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	up := lifecycle.Condition{Status: "True", Since: now.Add(-time.Hour)}
	var nodes []NodeInfo
	var claims []lifecycle.Facts
	for i := 0; i < 10000; i++ {
		name := fmt.Sprintf("gpu-%05d", i)
		f := lifecycle.Facts{Name: name + "-nc", NodeName: name, ProviderID: "aws:///" + name, Created: now.Add(-2 * time.Hour),
			Launched: up, Registered: up, Initialized: up}
		if i%100 == 0 {
			f.Deleting = now.Add(-3 * time.Hour)
		}
		if i%250 == 0 {
			f.NodeName = "" // found by providerID
		}
		claims = append(claims, f)
		if i%500 != 0 { // every 500th claim has no Node
			nodes = append(nodes, NodeInfo{Name: name, ProviderID: "aws:///" + name})
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if cs := ClassifyFleet("c1", nodes, claims, now, lifecycle.Graces{}); len(cs) != len(claims) {
			b.Fatal(len(cs))
		}
	}
}
