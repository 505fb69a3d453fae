package api_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/shadow"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
)

// BenchmarkShadowConcurrent sends six concurrent shadow requests (issue
// 11's 4.0 GB case) for a week holding 5,000 findings of 50 nodes, through
// the real report, and reports the controller's peak Go heap while they run
// (runtime.MemStats.HeapInuse above the start, sampled every 5 ms) and how
// many were computed. Measured on 2 shared cores: limit=2 (the default)
// 26 MB peak, 2 computed and 4 answered 429; limit=6 67 MB, 6 computed:
// memory grows with the reports computed at once, which the limit bounds.
//
//	go test -run '^$' -bench BenchmarkShadowConcurrent -benchtime 1x ./web/api
func BenchmarkShadowConcurrent(b *testing.B) {
	st, err := store.Open(context.Background(), pgtest.DSN(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(st.Close)
	now := time.Now().UTC().Truncate(time.Second)
	const nodes, perNode = 50, 100
	for n := range nodes {
		r := finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: fmt.Sprintf("n%d", n), BootID: "b1", SentAt: now}
		for i := range perNode {
			f := finding.Finding{Detector: finding.DetectorXid, Xid: 13, GPUPCI: "0000:3b:00.0", Count: 1, Seq: uint64(i),
				Time:     now.Add(-time.Duration(i) * 30 * time.Minute / perNode * 24),
				Evidence: []string{fmt.Sprintf("NVRM: Xid (PCI:0000:3b:00): 13, pid=%d, name=python3, Graphics SM Warp Exception on (GPC 1, TPC 2, SM 0)", i)}}
			f.Node, f.BootID = r.Node, r.BootID
			f.ID = finding.NewID(f)
			r.Findings = append(r.Findings, f)
		}
		if _, err := st.IngestReport(context.Background(), r, now); err != nil {
			b.Fatal(err)
		}
	}
	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		b.Fatal(err)
	}
	var list []auth.Operator
	for i := range 6 {
		list = append(list, auth.Operator{Name: fmt.Sprintf("v%d", i), Role: auth.RoleViewer, TokenSHA256: auth.TokenHash(fmt.Sprintf("tok-%d", i))})
	}
	ops, err := auth.NewOperators(list)
	if err != nil {
		b.Fatal(err)
	}
	for _, limit := range []int{api.DefaultShadowConcurrent, 6} {
		b.Run(fmt.Sprintf("limit=%d", limit), func(b *testing.B) {
			h, err := api.Handler(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"}, Operators: ops,
				Shadow: shadow.Config{Store: st, Engine: eng, Clusters: []string{"c1"}}.ReportFunc(),
				Limits: api.Limits{ShadowConcurrent: limit}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			q := url.Values{"since": {now.Add(-7 * 24 * time.Hour).Format(time.RFC3339)}}
			var peak atomic.Uint64
			computed := 0
			for b.Loop() {
				runtime.GC()
				var base runtime.MemStats
				runtime.ReadMemStats(&base)
				stop := make(chan struct{})
				sampled := make(chan struct{})
				go func() {
					defer close(sampled)
					var ms runtime.MemStats
					for {
						select {
						case <-stop:
							return
						case <-time.After(5 * time.Millisecond):
							runtime.ReadMemStats(&ms)
							if d := ms.HeapInuse - min(base.HeapInuse, ms.HeapInuse); d > peak.Load() {
								peak.Store(d)
							}
						}
					}
				}()
				var wg sync.WaitGroup
				var ok atomic.Int32
				for i := range 6 {
					wg.Go(func() {
						code, _, _ := getShadowAs(srv, fmt.Sprintf("tok-%d", i), q)
						if code == http.StatusOK {
							ok.Add(1)
						}
					})
				}
				wg.Wait()
				close(stop)
				<-sampled
				computed += int(ok.Load())
			}
			b.ReportMetric(float64(peak.Load())/(1<<20), "peak-heap-MB")
			b.ReportMetric(float64(computed)/float64(b.N), "reports-computed/op")
		})
	}
}
