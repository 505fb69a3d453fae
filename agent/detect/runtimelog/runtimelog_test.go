package runtimelog

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

func describe(f finding.Finding) string {
	s := f.Detector + " count=" + strconv.Itoa(f.Count)
	if f.Xid != 0 {
		s += " xid=" + strconv.Itoa(f.Xid)
	}
	keys := make([]string, 0, len(f.Attrs))
	for k := range f.Attrs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		s += " " + k + "=" + f.Attrs[k]
	}
	return s
}

func TestParse(t *testing.T) {
	t.Parallel()
	pleg := func(ts, seen string) string {
		return "Mar 13 " + ts + " node-a1 kubelet[1450]: I0313 " + ts + ".934473    1450 kubelet.go:1778] skipping pod synchronization - [PLEG is not healthy: pleg was last seen active " + seen + " ago; threshold is 3m0s]"
	}
	tests := []struct {
		name string
		in   []string
		want []string
	}{
		{"one PLEG stall", []string{pleg("16:02:43", "3m5s"), pleg("16:02:48", "3m10.5s")},
			[]string{"runtime-wedge count=2 component=kubelet-pleg last_seen_active_max=3m10.5s threshold=3m0s"}},
		{"two PLEG stalls far apart", []string{pleg("16:02:43", "3m5s"), pleg("17:02:43", "3m7s")}, []string{
			"runtime-wedge count=1 component=kubelet-pleg last_seen_active_max=3m5s threshold=3m0s",
			"runtime-wedge count=1 component=kubelet-pleg last_seen_active_max=3m7s threshold=3m0s"}},
		{"kill timeout", []string{`E0101 00:00:00.000000 1 kuberuntime_container.go:1] "KillContainer from runtime service failed" err="rpc error: code = DeadlineExceeded desc = context deadline exceeded"`},
			[]string{"runtime-wedge count=1 cause=kill of a container does not complete component=container-runtime"}},
		{"xid critical", []string{`I0101 00:00:00.000000 1 health.go:1] XidCriticalError: Xid=79 on Device=GPU-abc, the device will go unhealthy.`},
			[]string{"device-plugin count=1 xid=79 error=device marked unhealthy after Xid 79 gpu_uuid=GPU-abc"}},
		{"allocation without nvml", []string{`Allocate failed due to device plugin Allocate rpc failed with err: rpc error: code = Unavailable desc = connection error`},
			[]string{"device-plugin count=1 error=Allocate failed (rpc error: code = Unavailable desc = connection error)"}},
		{"allocation storm is one finding", []string{
			`Pod Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: error creating nvml.Device 1: nvml: Unknown Error`,
			`Pod Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: error creating nvml.Device 1: nvml: Unknown Error`},
			[]string{"device-plugin count=2 error=GetPreferredAllocation failed (nvml device 1 unknown error) nvml_index=1"}},
		{"nvml missing in text log", []string{`E1 x.go:1] Failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND`},
			[]string{"monitoring-plane count=1 component=nvml error=Failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND"}},
		{"dcgm json, cut off", []string{`{"level":"error","ts":"2025-03-04T07:57:23Z","error":"failed to initialize DCGM: Error connecting to nv-hostengine: Host engine connection invalid/disconnected","stacktrace":"x`},
			[]string{"monitoring-plane count=1 component=dcgm error=Error connecting to nv-hostengine: Host engine connection invalid/disconnected"}},
		{"describe node: other agents' condition rows", []string{
			"  KernelDeadlock       True    Tue, 01 Dec 2026 12:58:11 +0000   Tue, 01 Dec 2026 11:40:02 +0000   DockerHung                   kernel: INFO: task containerd:1882 blocked for more than 120 seconds.",
			"  AcceleratedHardwareReady   False   Tue, 01 Dec 2026 12:58:11 -0500   Tue, 01 Dec 2026 11:40:02 -0500   NvidiaXID79Error",
			"  Ready                True    Tue, 01 Dec 2026 12:58:40 +0000   Tue, 01 Dec 2026 09:02:01 +0000   KubeletReady                 kubelet is posting ready status"}, []string{
			"node-condition count=1 last_heartbeat=2026-12-01T12:58:11Z message=kernel: INFO: task containerd:1882 blocked for more than 120 seconds. reason=DockerHung status=True type=KernelDeadlock",
			"node-condition count=1 last_heartbeat=2026-12-01T17:58:11Z message= reason=NvidiaXID79Error status=False type=AcceleratedHardwareReady"}},
		{"informational lines", []string{
			`I1025 02:19:08.002792       1 health.go:151] Skipping non-nvmlEventTypeXidCriticalError event: {Device:{Handle:0x7f0dcf40bdf8} EventType:2}`,
			`W1005 15:16:32.478854 2560706 nvc.c:269] failed to set inheritable capabilities`,
			`Mar 13 16:02:43 node-a1 kubelet[1450]: I0313 16:02:43.9 1450 kubelet.go:1] SyncLoop (PLEG): event for pod`}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fs, _, err := Parse(strings.NewReader(strings.Join(tt.in, "\n")))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, f := range fs {
				got = append(got, describe(f))
				if len(f.Evidence) == 0 {
					t.Errorf("finding without evidence: %+v", f)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
		})
	}
}

func TestFabricLines(t *testing.T) {
	t.Parallel()
	in := strings.Join([]string{
		"[Jul 01 2024 10:00:00] [ERROR] [tid 841] detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch pci bus id 00000000:07:00.0 physical id 2 port 62",
		"[Jul 01 2024 10:00:00] [ERROR] [tid 841] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:8A:00.0 physical id 3 port 33",
		"RuntimeError: CUDA error: system not yet initialized",
	}, "\n")
	fs, _, err := Parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 3 || fs[0].Detector != "nvswitch-sxid" || fs[0].DevicePCI != "0000:07:00.0" || fs[0].Attrs["severity"] != "non-fatal" || fs[0].Attrs["link"] != "62" ||
		fs[1].DevicePCI != "0000:8a:00.0" || fs[1].Attrs["severity"] != "fatal" || fs[2].Detector != "fabric-state" {
		t.Fatalf("findings %+v", fs)
	}
}

func TestNodeNotReadyEvent(t *testing.T) {
	t.Parallel()
	fs, _, err := Parse(strings.NewReader("Normal   NodeNotReady  2m   node-controller  Node ip-10-0-1-23.ec2.internal status is now: NodeNotReady\n"))
	if err != nil || len(fs) != 1 || fs[0].Detector != "node-condition" || fs[0].Attrs["type"] != "Ready" || fs[0].Attrs["status"] != "Unknown" {
		t.Fatalf("%v %+v", err, fs)
	}
}
