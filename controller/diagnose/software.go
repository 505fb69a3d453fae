package diagnose

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
)

// This file holds the rules for faults that are not a GPU's hardware: the
// driver and image (software), the NVSwitch fabric, the node's OS, NICs and
// RDMA paths, and Kubernetes' own lifecycle signals (catalog 1.1.0).

// sxidRestart lists the SXids whose entry in NVIDIA's NVSwitch SXid
// catalogue (Fabric Manager user guide, "NVSwitch SXid errors") is printed as
// non-fatal but names a system restart as the recovery, because the error
// stalls the GPUs' NVLink traffic: 12028 egress non-posted PRIV error (c25).
// sxidFatal lists SXids the catalogue marks fatal, for events whose summary
// line (which carries the severity) is missing from the input. The summary
// line's own severity always wins.
var (
	sxidRestart = map[int]bool{12028: true}
	sxidFatal   = map[int]bool{20034: true, 24007: true}
)

// sxidReason maps an nvswitch-sxid finding to its reason.
func sxidReason(f *finding.Finding) string {
	n, _ := strconv.Atoi(f.Attr(finding.AttrSXid))
	switch sev := f.Attr(finding.AttrSeverity); {
	case sev == "fatal", sev == "" && sxidFatal[n], sxidRestart[n]:
		return catalog.ReasonNVSwitchFatalError
	}
	return catalog.ReasonNVSwitchNonFatalError
}

// FabricWindow is how close in time a GPU Xid must be to an SXid of the same
// node to be part of one fabric incident: the driver prints both within the
// same second (c25).
const FabricWindow = time.Second

// fabricXid reports whether an Xid's reason is one an NVSwitch incident
// explains when they come together: NVLink errors, application-class and
// informational Xids (Xid 94 and 137 over NVLink, c25). Memory, bus and
// firmware faults keep their own incident.
func fabricXid(reason string) bool {
	switch reason {
	case catalog.ReasonNVLinkError, catalog.ReasonXidApplicationError, catalog.ReasonXidInformational, catalog.ReasonContainedMemoryError, catalog.ReasonXidOnSuspectSoftware,
		catalog.ReasonXidUnclassified, catalog.ReasonGPURecoveryActionRequired:
		return true
	}
	return false
}

// mismatchReason maps a driver-version-mismatch finding: a module built for
// another kernel or a GPU the driver branch does not support is the image's
// defect (no reboot helps); every other mismatch between the loaded module
// and the user-space driver clears with a reboot that loads the module
// matching the libraries on disk.
func mismatchReason(f *finding.Finding) string {
	switch f.Attr(finding.AttrError) {
	case "module built for another kernel", "GPU not supported by this driver":
		return catalog.ReasonDriverImageDefect
	}
	return catalog.ReasonDriverVersionMismatch
}

// gpuModules are the kernel modules of the NVIDIA driver stack; a stack
// report whose module is one of them is the driver's hang.
var gpuModules = map[string]bool{"nvidia": true, "nvidia_uvm": true, "nvidia_modeset": true,
	"nvidia_drm": true, "nvidia_peermem": true, "nvidia_fs": true, "nv_peer_mem": true, "gdrdrv": true}

// stackReason maps a hung-task, soft-lockup or rcu-stall finding. A report
// whose own stack names no GPU module is still the driver's hang when it is
// about a CPU or a task that a driver-hang report of the same boot names
// (hangs, from driverHangs): the watchdog repeats a soft lockup every few
// seconds without the stack, and an RCU stall on the stuck CPU prints no
// frames of the task (kernel/watchdog.c, kernel/rcu/tree_stall.h).
func stackReason(f *finding.Finding, hangs []driverHang) string {
	if gpuModules[f.Attr(finding.AttrModule)] || sameHang(f, hangs) {
		return catalog.ReasonGPUDriverHang
	}
	if f.Detector == finding.DetectorHungTask {
		return catalog.ReasonKernelHungTask
	}
	return catalog.ReasonKernelLockup
}

// driverHangWindow bounds how far apart a report and the driver-hang report
// it joins may be: a lockup is repeated while it lasts (every 4 x
// watchdog_thresh s, 40 s by default), an RCU stall every 60-180 s.
const driverHangWindow = 10 * time.Minute

// driverHang is the CPUs and task of a report whose stack is in the GPU driver.
type driverHang struct {
	cpus   []string
	pid    string
	bootID string
	at     time.Time
}

// driverHangs returns the reports among fs whose stacks name a GPU module.
func driverHangs(fs []finding.Finding) []driverHang {
	var out []driverHang
	for i := range fs {
		f := &fs[i]
		switch f.Detector {
		case finding.DetectorHungTask, finding.DetectorSoftLockup, finding.DetectorRCUStall:
		default:
			continue
		}
		if !gpuModules[f.Attr(finding.AttrModule)] {
			continue
		}
		out = append(out, driverHang{cpus: stackCPUs(f), pid: f.Attr(finding.AttrPID), bootID: f.BootID, at: f.Time})
	}
	return out
}

// stackCPUs is the CPU list of a lockup or stall report (AttrCPU, comma-separated).
func stackCPUs(f *finding.Finding) []string {
	c := f.Attr(finding.AttrCPU)
	if c == "" {
		return nil
	}
	return strings.Split(c, ",")
}

// sameHang reports whether f names a CPU or a task of one of hangs, of the
// same boot and within driverHangWindow of it (untimed reports of one boot
// are taken to be of the same input and join).
func sameHang(f *finding.Finding, hangs []driverHang) bool {
	cpus, pid := stackCPUs(f), f.Attr(finding.AttrPID)
	for _, h := range hangs {
		if f.BootID != h.bootID {
			continue
		}
		if !f.Time.IsZero() && !h.at.IsZero() && (f.Time.Sub(h.at) > driverHangWindow || h.at.Sub(f.Time) > driverHangWindow) {
			continue
		}
		if pid != "" && pid == h.pid {
			return true
		}
		for _, c := range cpus {
			if slices.Contains(h.cpus, c) {
				return true
			}
		}
	}
	return false
}

// nodeMounts are mount points whose filesystem is the node's own: the root,
// /var and the kubelet's and runtimes' state. A failure there stops the node.
var nodeMounts = []string{"/", "/var", "/var/lib/kubelet", "/var/lib/containerd", "/var/lib/docker",
	"/var/lib/containers", "/var/log", "/tmp", "/mnt/ephemeral", "/local"}

// VolumeRole says whose a failing filesystem is: "node" (root or ephemeral
// volume: a node fault), "data" (a data volume: a storage event) or ""
// (unknown: recorded as a storage event, never repaired on). The agent's
// volume_role or mount attribute decides; without them (a dmesg scanned
// offline), the device name: the first disk of a node and its partitions
// (nvme0n1p1, sda1, xvda1, vda1), device-mapper and MD RAID devices (the
// root LV, the RAID0 of instance-store disks that EKS and GKE put under
// /var/lib/kubelet) are the node's; network, loop and ZFS devices (rbd, nbd,
// loop, drbd, zd) are data volumes; other disks (nvme1n1, sdb: an attached
// volume or a local disk) are unknown.
func VolumeRole(f *finding.Finding) string {
	switch f.Attr(finding.AttrVolumeRole) {
	case "root", "ephemeral", "node":
		return "node"
	case "data":
		return "data"
	}
	if m := f.Attr(finding.AttrMount); m != "" {
		if strings.HasPrefix(m, "/var/lib/kubelet/pods/") || strings.HasPrefix(m, "/var/lib/kubelet/plugins/") {
			return "data" // a PersistentVolume mounted for a pod
		}
		for _, nm := range nodeMounts {
			if m == nm || nm != "/" && strings.HasPrefix(m, nm+"/") {
				return "node"
			}
		}
		return "data"
	}
	dev := f.Attr(finding.AttrDevice)
	for _, p := range []string{"rbd", "nbd", "loop", "drbd", "zd"} {
		if strings.HasPrefix(dev, p) {
			return "data"
		}
	}
	if nodeDeviceRE.MatchString(dev) {
		return "node"
	}
	return ""
}

// nodeDeviceRE matches the device names VolumeRole takes for the node's own
// disks when nothing better is known.
var nodeDeviceRE = regexp.MustCompile(`^(?:nvme0n1(?:p\d+)?|[sxv]?da\d*|xvda\d*|dm-\d+|md\d+|mapper/.*)$`)

// systemDaemons are the node's own processes: an OOM kill of one of them
// leaves the node without its kubelet, runtime, GPU daemons or agent.
var systemDaemons = map[string]bool{"kubelet": true, "containerd": true, "containerd-shim": true, "dockerd": true,
	"crio": true, "conmon": true, "systemd": true, "systemd-journal": true, "systemd-journald": true, "sshd": true,
	"nvidia-persistenced": true, "nv-fabricmanager": true, "nvidia-fabricmanager": true, "nv-hostengine": true,
	"nvidia-imex": true, "fleetrepair-agent": true, "kube-proxy": true, "aws-node": true, "nvidia-device-plugin": true,
	"dcgm-exporter": true, "nvidia-container-runtime": true}

// oomReason maps an oom-kill finding: the global OOM killer taking a system
// daemon is a node fault; a cgroup's own limit or a workload victim is the
// workload's business ("" - no diagnosis).
func oomReason(f *finding.Finding) string {
	if c := f.Attr(finding.AttrConstraint); c != "" && c != "CONSTRAINT_NONE" {
		return ""
	}
	if systemDaemons[f.Attr(finding.AttrTask)] {
		return catalog.ReasonSystemDaemonOOMKilled
	}
	return ""
}

// FabricGrace is how long after boot a GPU may still be joining the NVLink
// fabric (Fabric Manager "In Progress" / "Not Started") before that is a
// fault.
const FabricGrace = 10 * time.Minute

// fabricStateReason maps a fabric-state finding: an error status, or a GPU
// still not on the fabric when the finding says it is past the boot grace
// (attr uptime_s). Without the uptime an unfinished registration is no
// verdict: every node passes through it while booting.
func fabricStateReason(f *finding.Finding) string {
	st := f.Attr(finding.AttrState)
	status := strings.ToLower(f.Attr(finding.AttrStatus))
	if st == "completed" && status != "" && status != "success" && status != "n/a" {
		return catalog.ReasonFabricNotReady
	}
	if st == "not ready" {
		// A CUDA client was refused because the GPUs are not on the fabric
		// (cudaErrorSystemNotReady): the node took work it cannot run.
		return catalog.ReasonFabricNotReady
	}
	if st == "in progress" || st == "not started" {
		if up, err := strconv.Atoi(f.Attr("uptime_s")); err == nil && time.Duration(up)*time.Second >= FabricGrace {
			return catalog.ReasonFabricNotReady
		}
	}
	return ""
}

// driverChanged reports whether the current boot loaded another driver
// version than an earlier boot of the node: the driver-version findings
// (the module's load banner) of both disagree.
func driverChanged(current, history []finding.Finding) bool {
	now := map[string]bool{}
	for _, f := range current {
		if f.Detector == finding.DetectorDriverVersion && f.Attr(finding.AttrValue) != "" {
			now[f.Attr(finding.AttrValue)] = true
		}
	}
	if len(now) == 0 {
		return false
	}
	for _, f := range history {
		if v := f.Attr(finding.AttrValue); f.Detector == finding.DetectorDriverVersion && v != "" && !now[v] {
			return true
		}
	}
	return false
}

// repeatedPeers returns the NCCL net-error signals of a node when they name
// at least n distinct peers within window of now, seen by at least two
// jobs: the node's NIC or switch port, not one path or one job, is the
// common factor. A finding of a job report carries its job
// (finding.AttrJob); one without (a job log the node's agent read) counts
// as its own job. Findings of a fabric incident (a job report whose
// failures spread over many node pairs at once, finding.FabricIncident)
// count for no node: the fabric failed, and the cohort breakers see it.
func repeatedPeers(sigs []signal, n int, window time.Duration, now time.Time) []signal {
	var in []signal
	peers, jobs := map[string]bool{}, map[string]bool{}
	for _, s := range sigs {
		if s.reason != catalog.ReasonNCCLNetworkError || s.f.Attr(finding.AttrFabricIncident) == "true" {
			continue
		}
		t := s.f.Time
		if t.IsZero() {
			t = now
		}
		if now.Sub(t) > window {
			continue
		}
		in = append(in, s)
		if p := s.f.Attr(finding.AttrPeer); p != "" {
			peers[p] = true
		}
		job := s.f.Attr(finding.AttrJob)
		if job == "" {
			job = "finding/" + s.f.ID
		}
		jobs[job] = true
	}
	if len(peers) < n || len(jobs) < 2 {
		return nil
	}
	return in
}

// driverNotLoaded reports whether an NVML error without a GPU says that no
// NVIDIA kernel module answers (nvidia-smi's "couldn't communicate with the
// NVIDIA driver", NVML's "Driver Not Loaded").
func driverNotLoaded(e string) bool {
	l := strings.ToLower(e)
	// "No devices were found": the module answers and enumerates no GPU at
	// all. It follows a driver or image change, a module that did not bind,
	// or a container without GPUs as often as hardware; GPUs really gone
	// from the bus are the sysfs GPU count's finding (GPULost), so nvidia-smi's
	// line alone asks for a reboot, never a replacement (blind trial,
	// test/fixtures/trial).
	return strings.Contains(l, "couldn't communicate with the nvidia driver") || strings.Contains(l, "driver not loaded") ||
		strings.Contains(l, "no devices were found")
}

// manyGPUsFailInit reports whether GPU initialisation (RmInitAdapter, GSP
// firmware bring-up) failed on two or more GPUs in this boot: hardware
// fails one GPU at a time, a driver or firmware that does not fit fails
// them all.
func manyGPUsFailInit(current []finding.Finding) bool {
	gpus := map[string]bool{}
	for _, f := range current {
		if f.GPUPCI == "" {
			continue
		}
		if f.Detector == finding.DetectorRmInitFailed ||
			f.Detector == finding.DetectorGSPError && strings.Contains(f.Attr(finding.AttrMessage), "init failed") {
			gpus[f.GPUPCI] = true
		}
	}
	return len(gpus) >= 2
}

// nodeFilesystemReason maps a filesystem-error finding on a node volume: a
// shutdown (XFS "Filesystem has been shut down", "Corruption of in-memory
// data detected ... Shutting down filesystem") or a read-only remount stops
// the node's writes, a failure; an error the filesystem survived (an XFS
// metadata CRC or I/O error, an ext4 or btrfs error with the filesystem
// still read-write) is an event. A finding that names no kind (another
// source) is taken as a failure.
func nodeFilesystemReason(f *finding.Finding) string {
	if f.Attr(finding.AttrKind) == "error" {
		return catalog.ReasonNodeFilesystemError
	}
	return catalog.ReasonNodeFilesystemFailure
}
