package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// BenchmarkNodeLedgers is the database side of the zone wave's evidence
// step (controller/repair evidence.go) for groups of 1, 8 and 64 nodes:
// each iteration reads a group of wave nodes (ReadNodes: each has a
// heartbeat and one GPU-lost finding stored) and writes their ledgers
// (WriteNodeLedgers: a condition diagnosis each, a repair opened with its
// finding linked), from one caller. b.N groups, so b.N x group nodes.
// Per node: read-us/node and write-us/node are the calls' wall time,
// pg-read-us/node and pg-write-us/node the CPU time of the PostgreSQL
// backends meanwhile (pgtest.BackendCPU), the figure that survives a
// shared machine.
//
//	go test ./controller/store -run '^$' -bench NodeLedgers -benchtime 40x
func BenchmarkNodeLedgers(b *testing.B) {
	for _, size := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("group=%d", size), func(b *testing.B) {
			ctx := context.Background()
			s, _, cpu := openMeasured(b)
			now := time.Now().UTC()
			nodes := make([]string, b.N*size)
			fids := make([]string, len(nodes))
			for i := range nodes {
				nodes[i] = fmt.Sprintf("gpu-%05d", i)
				f := finding.Finding{Detector: finding.DetectorXid, Xid: 79, GPUPCI: "0000:02:00.0", Node: nodes[i], BootID: "boot-1",
					Count: 1, Time: now, Evidence: []string{"NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."}}
				f.ID = finding.NewID(f)
				fids[i] = f.ID
				if _, err := s.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "load", Node: nodes[i],
					BootID: "boot-1", Findings: []finding.Finding{f}, Heartbeat: &finding.Heartbeat{DriverVersion: "550.54.15", GPUCount: 8}}, now); err != nil {
					b.Fatal(err)
				}
			}
			var readWall, writeWall, readPG, writePG time.Duration
			b.ResetTimer()
			for g := range b.N {
				group := nodes[g*size : (g+1)*size]
				metas := make([]store.Node, size)
				for i, n := range group {
					metas[i] = store.Node{Cluster: "load", Name: n, NodePool: "gpu", Zone: "zone-a", InstanceType: "p5.48xlarge",
						NodeClaim: "claim-" + n, Labels: map[string]string{"topology.kubernetes.io/zone": "zone-a"}}
				}
				c0, start := cpu(), time.Now()
				snaps, err := s.ReadNodes(ctx, metas, 0, now)
				readWall += time.Since(start)
				c1 := cpu()
				readPG += c1 - c0
				if err != nil {
					b.Fatal(err)
				}
				ws := make([]store.NodeLedger, size)
				for i, n := range group {
					if len(snaps[i].Findings) != 1 || snaps[i].HasOpen {
						b.Fatalf("%s read %+v, want one finding and no repair", n, snaps[i])
					}
					id := fids[g*size+i]
					r := store.Repair{Cluster: "load", Node: n, NodeClaim: "claim-" + n, NodeClaimUID: "uid-" + n, NodePool: "gpu",
						Reason: "GPUFallenOffBus", FaultClass: "accelerated-hardware", RecommendedAction: "replace", FindingIDs: []string{id}}
					ws[i] = store.NodeLedger{Cluster: "load", Node: n, Open: &r, Actor: "controller", Reason: "GPU fell off the bus",
						Diagnoses: []store.DiagnosisRecord{{Cluster: "load", Node: n, BootID: "boot-1", Reason: "GPUFallenOffBus",
							Severity: "condition", FaultClass: "accelerated-hardware", Action: "replace", FirstSeen: now, LastSeen: now,
							FindingIDs: []string{id}, Detail: map[string]any{"message": "GPU has fallen off the bus"}}}}
				}
				t1 := time.Now()
				res, errs := s.WriteNodeLedgers(ctx, ws, now)
				writeWall += time.Since(t1)
				writePG += cpu() - c1
				for i := range ws {
					if errs[i] != nil || !res[i].Opened {
						b.Fatalf("%s: opened %v, %v", ws[i].Node, res[i].Opened, errs[i])
					}
				}
			}
			b.StopTimer()
			per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(len(nodes)) }
			b.ReportMetric(per(readWall), "read-us/node")
			b.ReportMetric(per(writeWall), "write-us/node")
			b.ReportMetric(per(readPG), "pg-read-us/node")
			b.ReportMetric(per(writePG), "pg-write-us/node")
		})
	}
}
