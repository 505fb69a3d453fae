//go:build cgo

package dcgm

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	godcgm "github.com/NVIDIA/go-dcgm/pkg/dcgm"
)

// NewClient returns DCGM through go-dcgm, connecting to nv-hostengine at
// address (standalone mode: the agent never starts a host engine).
func NewClient(address string) Client { return &client{addr: address} }

type client struct {
	addr      string
	healthSet bool
}

func (c *client) Connect() error {
	if _, err := godcgm.Init(godcgm.Standalone, c.addr, "0"); err != nil {
		if strings.Contains(err.Error(), "not found") && strings.Contains(err.Error(), "libdcgm") {
			return fmt.Errorf("dcgm init: %v (the agent image carries libdcgm for one DCGM major version: use the image variant of the host engine's): %w", err, ErrLibraryNotFound)
		}
		return fmt.Errorf("dcgm init: connect to nv-hostengine at %s (--dcgm-address): %w", c.addr, err)
	}
	return nil
}

func (c *client) DeviceCount() (int, error) {
	n, err := godcgm.GetAllDeviceCount()
	return int(n), err
}

var systems = map[godcgm.HealthSystem]string{
	godcgm.DCGM_HEALTH_WATCH_PCIE: "pcie", godcgm.DCGM_HEALTH_WATCH_NVLINK: "nvlink", godcgm.DCGM_HEALTH_WATCH_PMU: "pmu",
	godcgm.DCGM_HEALTH_WATCH_MCU: "mcu", godcgm.DCGM_HEALTH_WATCH_MEM: "mem", godcgm.DCGM_HEALTH_WATCH_SM: "sm",
	godcgm.DCGM_HEALTH_WATCH_INFOROM: "inforom", godcgm.DCGM_HEALTH_WATCH_THERMAL: "thermal",
	godcgm.DCGM_HEALTH_WATCH_POWER: "power", godcgm.DCGM_HEALTH_WATCH_DRIVER: "driver",
}

func (c *client) Health() ([]Incident, error) {
	g := godcgm.GroupAllGPUs()
	if !c.healthSet {
		if err := godcgm.HealthSet(g, godcgm.DCGM_HEALTH_WATCH_ALL); err != nil {
			return nil, fmt.Errorf("set health watches: %w", err)
		}
		c.healthSet = true
	}
	r, err := godcgm.HealthCheck(g)
	if err != nil {
		return nil, fmt.Errorf("health check: %w", err)
	}
	var out []Incident
	for _, in := range r.Incidents {
		res := "warn"
		if in.Health == godcgm.DCGM_HEALTH_RESULT_FAIL {
			res = "fail"
		}
		sys := systems[in.System]
		if sys == "" {
			sys = strconv.FormatUint(uint64(in.System), 10)
		}
		out = append(out, Incident{GPU: int(in.EntityInfo.EntityId), System: sys, Result: res,
			Code: strconv.FormatUint(uint64(in.Error.Code), 10), Message: in.Error.Message})
	}
	return out, nil
}

func (c *client) Violations(ctx context.Context) (<-chan Violation, error) {
	in, err := godcgm.ListenForPolicyViolations(ctx, godcgm.DbePolicy, godcgm.PCIePolicy, godcgm.MaxRtPgPolicy,
		godcgm.ThermalPolicy, godcgm.PowerPolicy, godcgm.NvlinkPolicy, godcgm.XidPolicy)
	if err != nil {
		return nil, fmt.Errorf("listen for policy violations: %w", err)
	}
	out := make(chan Violation, 16)
	go func() {
		defer close(out)
		for v := range in {
			x := Violation{GPU: int(v.GPU), Condition: string(v.Condition), Time: v.Timestamp, Detail: fmt.Sprintf("%+v", v.Data)}
			if d, ok := v.Data.(godcgm.XidPolicyCondition); ok {
				x.Xid = int(d.ErrNum)
			}
			select {
			case out <- x:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}
