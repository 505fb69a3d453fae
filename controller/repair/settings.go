package repair

import (
	"fmt"

	"github.com/fleetrepair/fleetrepair/controller/config"
)

// ConfigFrom returns the reconciler's settings for the controller
// configuration c (controller/config): dry run, the toleration override,
// the policy (overrides and minimum healthy counts), the lookback, the
// resync period, the workers, the breaker age bound, the breakers, the
// paced release and the approval expiry. The shadow report
// (shadow.FromConfig) and the simulator (simulate.Options.Config) take the
// same c. The deletion budgets are not here: they are the clusters
// table's, which cmd/runner sets from c at start and the guard
// transaction reads. Store, Engine, Clusters and the rest are the
// caller's to set. An invalid breaker configuration is an error.
func ConfigFrom(c config.Config) (Config, error) {
	bp, err := c.BreakerPolicy()
	if err != nil {
		return Config{}, fmt.Errorf("repair config: %w", err)
	}
	return Config{DryRun: c.Repair.DryRun, Toleration: c.Repair.Toleration, Policy: c.ResolvedPolicy(), Lookback: c.Repair.Lookback,
		Resync: c.Repair.Resync, Workers: c.Repair.Workers, MaxBreakerAge: c.Repair.BreakerAge(), Breaker: bp,
		DrainPerPass: c.Repair.DrainPerPass, ApprovalTTL: c.Repair.ApprovalTTL}, nil
}
