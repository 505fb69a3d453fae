package diagnose_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
)

// fd builds a finding of any detector: attrs are key, value pairs.
func fd(detector, boot string, at time.Duration, attrs ...string) finding.Finding {
	f := finding.Finding{Detector: detector, BootID: boot, Time: t0.Add(at), Count: 1, Attrs: map[string]string{},
		Evidence: []string{fmt.Sprintf("%s %s %v", detector, at, attrs)}}
	for i := 0; i+1 < len(attrs); i += 2 {
		f.Attrs[attrs[i]] = attrs[i+1]
	}
	f.ID = finding.NewID(f)
	return f
}

func withGPU(f finding.Finding, gpu string) finding.Finding {
	f.GPUPCI = gpu
	f.ID = finding.NewID(f)
	return f
}

// TestSoftwareOSFabricRules covers every way the catalog 1.1.0 classes show
// up, beyond the corpus files: each row's headline reason and how many
// diagnoses (incidents) the node gets.
func TestSoftwareOSFabricRules(t *testing.T) {
	t.Parallel()
	const g1, g2 = "0000:4c:00.0", "0000:cb:00.0"
	mismatch := func(src string, attrs ...string) finding.Finding {
		return fd(finding.DetectorDriverVersionMismatch, "b1", 0, append([]string{"source", src}, attrs...)...)
	}
	sxid := func(at time.Duration, dev, n, sev string) finding.Finding {
		f := fd(finding.DetectorNVSwitchSXid, "b1", at, "sxid", n, "severity", sev)
		f.DevicePCI = dev
		f.ID = finding.NewID(f)
		return f
	}
	tests := []struct {
		name      string
		findings  []finding.Finding
		reason    string
		action    catalog.Action
		incidents int
	}{
		{"nvml mismatch from nvidia-smi", []finding.Finding{mismatch("nvidia-smi", "error", "Driver/library version mismatch")},
			catalog.ReasonDriverVersionMismatch, catalog.ActionReboot, 1},
		{"NVRM API mismatch in the kernel log", []finding.Finding{mismatch("kernel", "error", "API mismatch", "client_version", "550.54.15", "module_version", "550.54.14")},
			catalog.ReasonDriverVersionMismatch, catalog.ActionReboot, 1},
		{"prestart hook and nvidia-smi on one node: one incident", []finding.Finding{mismatch("nvidia-container-cli", "error", "driver/library version mismatch"), mismatch("nvidia-smi", "error", "Driver/library version mismatch")},
			catalog.ReasonDriverVersionMismatch, catalog.ActionReboot, 1},
		{"module built for another kernel: the image, no reboot helps", []finding.Finding{mismatch("kernel", "error", "module built for another kernel")},
			catalog.ReasonDriverImageDefect, catalog.ActionNone, 1},
		{"nvidia-smi cannot reach any driver", []finding.Finding{fd(finding.DetectorNVMLError, "b1", 0, "error", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver")},
			catalog.ReasonDriverNotLoaded, catalog.ActionReboot, 1},
		{"a lost GPU is still lost", []finding.Finding{withGPU(fd(finding.DetectorNVMLError, "b1", 0, "error", "GPU is lost"), g1)},
			catalog.ReasonGPULost, catalog.ActionReplace, 1},
		{"GSP firmware missing", []finding.Finding{fd(finding.DetectorGSPFirmwareMissing, "b1", 0, "firmware", "nvidia/535.54.03/gsp_ga10x.bin")},
			catalog.ReasonDriverImageDefect, catalog.ActionNone, 1},
		{"RmInitAdapter after a driver change is the driver's", []finding.Finding{
			fd(finding.DetectorDriverVersion, "b0", -time.Hour, "value", "535.104.05"),
			fd(finding.DetectorDriverVersion, "b1", 0, "value", "550.54.14"),
			withGPU(fd(finding.DetectorRmInitFailed, "b1", time.Second, "error_code", "0x62:0x40:2192"), g1),
			withGPU(fd(finding.DetectorRmInitFailed, "b1", 2*time.Second), g2),
		}, catalog.ReasonDriverInitFailedAfterChange, catalog.ActionReboot, 1},
		{"RmInitAdapter on several GPUs at once is the driver's", []finding.Finding{
			withGPU(fd(finding.DetectorRmInitFailed, "b1", time.Second, "error_code", "0x62:0x40:2192"), g1),
			withGPU(fd(finding.DetectorRmInitFailed, "b1", 2*time.Second, "error_code", "0x62:0x40:2192"), g2),
		}, catalog.ReasonDriverInitFailedAfterChange, catalog.ActionReboot, 1},
		{"RmInitAdapter with the same driver stays the GPU's", []finding.Finding{
			fd(finding.DetectorDriverVersion, "b0", -time.Hour, "value", "550.54.14"),
			fd(finding.DetectorDriverVersion, "b1", 0, "value", "550.54.14"),
			withGPU(fd(finding.DetectorRmInitFailed, "b1", time.Second), g1),
		}, catalog.ReasonGPUInitFailed, catalog.ActionResetGPU, 1},
		{"fatal SXid", []finding.Finding{sxid(0, "0000:07:00.0", "20034", "fatal")},
			catalog.ReasonNVSwitchFatalError, catalog.ActionReboot, 1},
		{"non-fatal SXid of no consequence is an event", []finding.Finding{sxid(0, "0000:07:00.0", "11004", "non-fatal")},
			catalog.ReasonNVSwitchNonFatalError, catalog.ActionNone, 1},
		{"SXid and GPU Xids of the same second: one incident", []finding.Finding{
			sxid(0, "0000:07:00.0", "20034", "fatal"), sxid(0, "0000:08:00.0", "20034", "fatal"),
			fx("b1", 300*time.Millisecond, 74, g1), fx("b1", 500*time.Millisecond, 94, g2),
		}, catalog.ReasonNVSwitchFatalError, catalog.ActionReboot, 1},
		{"an Xid 94 a minute after the SXid is its own event", []finding.Finding{
			sxid(0, "0000:07:00.0", "20034", "fatal"), fx("b1", time.Minute, 94, g2),
		}, catalog.ReasonNVSwitchFatalError, catalog.ActionReboot, 2},
		{"a double-bit ECC error in the same second keeps its own incident", []finding.Finding{
			sxid(0, "0000:07:00.0", "20034", "fatal"), fx("b1", 0, 48, g1),
		}, catalog.ReasonNVSwitchFatalError, catalog.ActionReboot, 2},
		{"fabric registration failed", []finding.Finding{withGPU(fd(finding.DetectorFabricState, "b1", 0, "state", "completed", "status", "NVML_ERROR_INSUFFICIENT_RESOURCES"), g1)},
			catalog.ReasonFabricNotReady, catalog.ActionReboot, 1},
		{"fabric still registering at boot is no verdict", []finding.Finding{withGPU(fd(finding.DetectorFabricState, "b1", 0, "state", "in progress"), g1)},
			"", catalog.ActionNone, 0},
		{"fabric still registering past the boot grace", []finding.Finding{withGPU(fd(finding.DetectorFabricState, "b1", 0, "state", "in progress", "uptime_s", "900"), g1)},
			catalog.ReasonFabricNotReady, catalog.ActionReboot, 1},
		{"soft lockup inside nvidia", []finding.Finding{fd(finding.DetectorSoftLockup, "b1", 0, "kind", "soft", "module", "nvidia")},
			catalog.ReasonGPUDriverHang, catalog.ActionReboot, 1},
		{"soft lockup elsewhere", []finding.Finding{fd(finding.DetectorSoftLockup, "b1", 0, "kind", "soft", "module", "mlx5_core")},
			catalog.ReasonKernelLockup, catalog.ActionReboot, 1},
		{"RCU stall without modules", []finding.Finding{fd(finding.DetectorRCUStall, "b1", 0, "kind", "rcu_sched")},
			catalog.ReasonKernelLockup, catalog.ActionReboot, 1},
		{"RCU stall of the CPU a driver lockup holds is the driver hang", []finding.Finding{
			fd(finding.DetectorSoftLockup, "b1", 0, "kind", "soft", "cpu", "37", "pid", "98211", "module", "nvidia"),
			fd(finding.DetectorRCUStall, "b1", 20*time.Second, "kind", "rcu_sched", "cpu", "12,37"),
		}, catalog.ReasonGPUDriverHang, catalog.ActionReboot, 1},
		{"a repeated lockup of the driver's task without its stack is the driver hang", []finding.Finding{
			fd(finding.DetectorSoftLockup, "b1", 0, "kind", "soft", "cpu", "37", "pid", "98211", "module", "nvidia"),
			fd(finding.DetectorSoftLockup, "b1", 28*time.Second, "kind", "soft", "cpu", "5", "pid", "98211"),
			fd(finding.DetectorHungTask, "b1", 2*time.Minute, "task", "nvidia-smi", "pid", "98211"),
		}, catalog.ReasonGPUDriverHang, catalog.ActionReboot, 1},
		{"an RCU stall of another CPU stays the kernel's", []finding.Finding{
			fd(finding.DetectorSoftLockup, "b1", 0, "kind", "soft", "cpu", "37", "pid", "98211", "module", "nvidia"),
			fd(finding.DetectorRCUStall, "b1", 20*time.Second, "kind", "rcu_sched", "cpu", "12"),
		}, catalog.ReasonGPUDriverHang, catalog.ActionReboot, 2},
		{"a lockup of the same CPU an hour later is a new one", []finding.Finding{
			fd(finding.DetectorSoftLockup, "b1", 0, "kind", "soft", "cpu", "37", "pid", "98211", "module", "nvidia"),
			fd(finding.DetectorSoftLockup, "b1", time.Hour, "kind", "soft", "cpu", "37", "pid", "4410"),
		}, catalog.ReasonGPUDriverHang, catalog.ActionReboot, 2},
		{"hung task in nvidia_uvm", []finding.Finding{fd(finding.DetectorHungTask, "b1", 0, "task", "python", "module", "nvidia_uvm")},
			catalog.ReasonGPUDriverHang, catalog.ActionReboot, 1},
		{"XFS shutdown of the root volume", []finding.Finding{fd(finding.DetectorFilesystemError, "b1", 0, "fs", "xfs", "device", "nvme0n1p1", "kind", "shutdown")},
			catalog.ReasonNodeFilesystemFailure, catalog.ActionReboot, 1},
		{"XFS shutdown of /var on the root LV", []finding.Finding{fd(finding.DetectorFilesystemError, "b1", 0, "fs", "xfs", "device", "dm-1", "kind", "shutdown")},
			catalog.ReasonNodeFilesystemFailure, catalog.ActionReboot, 1},
		{"ext4 error on the kubelet's mount", []finding.Finding{fd(finding.DetectorFilesystemError, "b1", 0, "fs", "ext4", "device", "nvme1n1", "mount", "/var/lib/kubelet")},
			catalog.ReasonNodeFilesystemFailure, catalog.ActionReboot, 1},
		{"ext4 error on a PersistentVolume is storage's", []finding.Finding{fd(finding.DetectorFilesystemError, "b1", 0, "fs", "ext4", "device", "nvme2n1", "mount", "/var/lib/kubelet/pods/x/volumes/kubernetes.io~csi/pvc-1/mount")},
			catalog.ReasonStorageVolumeError, catalog.ActionNone, 1},
		{"XFS on a Ceph RBD is storage's", []finding.Finding{fd(finding.DetectorFilesystemError, "b1", 0, "fs", "xfs", "device", "rbd0", "kind", "shutdown")},
			catalog.ReasonStorageVolumeError, catalog.ActionNone, 1},
		{"an unknown attached disk is recorded, not repaired", []finding.Finding{fd(finding.DetectorFilesystemError, "b1", 0, "fs", "xfs", "device", "nvme3n1", "kind", "shutdown")},
			catalog.ReasonStorageVolumeError, catalog.ActionNone, 1},
		{"global OOM kill of the kubelet", []finding.Finding{fd(finding.DetectorOOMKill, "b1", 0, "task", "kubelet", "constraint", "CONSTRAINT_NONE")},
			catalog.ReasonSystemDaemonOOMKilled, catalog.ActionReboot, 1},
		{"a workload's cgroup OOM is the workload's", []finding.Finding{fd(finding.DetectorOOMKill, "b1", 0, "task", "python", "constraint", "CONSTRAINT_MEMCG")},
			"", catalog.ActionNone, 0},
		{"mlx5 firmware health", []finding.Finding{fd(finding.DetectorNICFirmware, "b1", 0, "kind", "device's health compromised")},
			catalog.ReasonNICFirmwareFault, catalog.ActionReboot, 1},
		{"a link flap is an event", []finding.Finding{fd(finding.DetectorNICLink, "b1", 0, "interface", "ib0", "state", "down")},
			catalog.ReasonNICLinkFlap, catalog.ActionNone, 1},
		{"NCCL errors with one peer stay an event", []finding.Finding{
			fd(finding.DetectorNCCLNetError, "b1", 0, "peer", "10.0.2.36", "status", "12"),
			fd(finding.DetectorNCCLNetError, "b1", time.Minute, "peer", "10.0.2.36", "status", "12"),
		}, catalog.ReasonNCCLNetworkError, catalog.ActionNone, 1},
		{"NCCL errors with three peers: the node's NIC path", []finding.Finding{
			fd(finding.DetectorNCCLNetError, "b1", 0, "peer", "10.0.2.36", "status", "12"),
			fd(finding.DetectorNCCLNetError, "b1", time.Minute, "peer", "10.0.2.37", "status", "12"),
			fd(finding.DetectorNCCLNetError, "b1", 2*time.Minute, "peer", "10.0.2.38", "status", "12"),
		}, catalog.ReasonRDMANetworkDegraded, catalog.ActionNone, 1},
		{"a lone NotReady node", []finding.Finding{fd(finding.DetectorNodeCondition, "b1", 0, "type", "Ready", "status", "Unknown", "reason", "NodeStatusUnknown")},
			catalog.ReasonNodeNotReady, catalog.ActionReplace, 1},
		{"NotReady because the runtime is wedged: the runtime decides", []finding.Finding{
			fd(finding.DetectorNodeCondition, "b1", 0, "type", "Ready", "status", "False", "reason", "KubeletNotReady"),
			fd(finding.DetectorRuntimeWedge, "b1", 0, "component", "kubelet-pleg"),
		}, catalog.ReasonContainerRuntimeNotReady, catalog.ActionRestartRuntime, 1},
		{"NPD KernelDeadlock", []finding.Finding{fd(finding.DetectorNodeCondition, "b1", 0, "type", "KernelDeadlock", "status", "True", "reason", "DockerHung")},
			catalog.ReasonKernelLockup, catalog.ActionReboot, 1},
		{"NPD ReadonlyFilesystem", []finding.Finding{fd(finding.DetectorNodeCondition, "b1", 0, "type", "ReadonlyFilesystem", "status", "True", "reason", "FilesystemIsReadOnly")},
			catalog.ReasonNodeFilesystemFailure, catalog.ActionReboot, 1},
		{"Ready=True is no finding", []finding.Finding{fd(finding.DetectorNodeCondition, "b1", 0, "type", "Ready", "status", "True", "reason", "KubeletReady")},
			"", catalog.ActionNone, 0},
		{"a NodeClaim registered but never initialized", []finding.Finding{fd(finding.DetectorNodeClaimStatus, "b1", 0, "launched", "True", "registered", "True", "initialized", "False")},
			catalog.ReasonNodeClaimNotInitialized, catalog.ActionNone, 1},
		{"a terminating Node", []finding.Finding{fd(finding.DetectorNodeTerminating, "b1", 0, "deletion_timestamp", "2025-04-21T19:27:22Z")},
			catalog.ReasonNodeTerminating, catalog.ActionNone, 1},
	}
	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ds := eng.Diagnose(diagnose.Input{Node: "node-a1", BootID: "b1", Findings: tc.findings, Now: t0.Add(5 * time.Minute)})
			h := diagnose.Headline(ds)
			if h.Reason != tc.reason || h.Action != tc.action || len(ds) != tc.incidents {
				t.Errorf("headline %q %s, %d diagnoses; want %q %s, %d\n%+v", h.Reason, h.Action, len(ds), tc.reason, tc.action, tc.incidents, ds)
			}
			for _, d := range ds {
				if catalog.SoftwareClasses[d.FaultClass] && (d.Action == catalog.ActionReplace || d.EscalateTo == catalog.ActionReplace) {
					t.Errorf("software fault %s would replace", d.Reason)
				}
			}
		})
	}
}
