package simulate

import (
	"path/filepath"
	"testing"
)

// BenchmarkZoneOutage replays testdata/zone-outage.yaml (3,000 nodes, 4 h,
// a zone failing while lone failures go on) under fleetrepair's policy
// only: diagnosis, breakers and the deletion guards with every budget.
//
//	go test -run '^$' -bench ZoneOutage -benchmem ./controller/simulate/
func BenchmarkZoneOutage(b *testing.B) {
	sc, err := LoadFile(filepath.Join("testdata", "zone-outage.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Run(sc, Options{Policies: []string{PolicyFleetRepair}}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBackgroundNoise replays testdata/background-noise.yaml (10,000
// nodes, 6 h of lone failures) under fleetrepair's policy only: every
// guarded repair counts its NodePool's in-flight and healthy nodes.
//
//	go test -run '^$' -bench BackgroundNoise -benchmem -benchtime 1x ./controller/simulate/
func BenchmarkBackgroundNoise(b *testing.B) {
	sc, err := LoadFile(filepath.Join("testdata", "background-noise.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Run(sc, Options{Policies: []string{PolicyFleetRepair}}); err != nil {
			b.Fatal(err)
		}
	}
}
