package textformat

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestBootTime: with the boot time known, dmesg's seconds since boot become
// wall-clock times; without it the findings stay untimed.
func TestBootTime(t *testing.T) {
	t.Parallel()
	in := "[ 7510.129324] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
	boot := time.Date(2026, 2, 2, 20, 47, 0, 0, time.UTC)
	res, err := Scan(context.Background(), strings.NewReader(in), Auto, Options{BootTime: boot})
	if err != nil || len(res.Findings) != 1 {
		t.Fatalf("scan: %v %+v", err, res.Findings)
	}
	if want := boot.Add(7510129324 * time.Microsecond); !res.Findings[0].Time.Equal(want) {
		t.Errorf("time %s, want %s", res.Findings[0].Time, want)
	}
	res, _ = Scan(context.Background(), strings.NewReader(in), Auto, Options{})
	if !res.Findings[0].Time.IsZero() {
		t.Errorf("no boot time, but time %s", res.Findings[0].Time)
	}
}

func TestSniff(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want Format
	}{
		{"[ 1.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1", KernelLog},
		{"6,1,2,-;NVRM: loading", KernelLog},
		{"Mar 13 16:02:43 node-a1 kernel: [ 1.0] NVRM: x", KernelLog},
		{"Mar 13 16:02:43 node-a1 kubelet[1450]: I0313 x", RuntimeLog},
		{"I1025 02:19:08.002792       1 health.go:151] x", RuntimeLog},
		{`{"level":"info"}`, JSONLog},
		{"# HELP DCGM_FI_DEV_XID_ERRORS x\n", Prometheus},
		{"Successfully ran diagnostic for group.\n| Diagnostic | Result |", DcgmiDiag},
		{"GPU 3: Tesla V100\n Link 3: <inactive>", NvidiaSMI},
		{"Failed to initialize NVML: Driver/library version mismatch\n", NvidiaSMI},
		{"job-a-worker-0:3468:3905 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer 10.0.2.36<54862> with status=12", JobLog},
		{"[2026-01-04 21:33:04] job-b-master-0:617:2799 [3] transport/net_ib.cc:2360 NCCL WARN NET/IB: x", JobLog},
		{"failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed", RuntimeLog},
		{"KubeletNotReady              container runtime is down", RuntimeLog},
		{"[Jul 01 2024 10:00:00] [ERROR] [tid 841] detected NVSwitch non-fatal error 12028 on fid 0", RuntimeLog},
		{"", KernelLog},
		// Kernel logs that name the nvidia-smi process stay kernel logs
		// (blind trial: these lost their Xids as "nvidia-smi output").
		{"[ 100.000000] NVRM: Xid (PCI:0000:4e:00): 79, pid=1234, name=nvidia-smi, GPU has fallen off the bus.", KernelLog},
		{"Dec  1 10:00:00 gpu-node-7 kernel: NVRM: Xid (PCI:0000:4e:00): 79, pid=1234, name=nvidia-smi, GPU has fallen off the bus.", KernelLog},
		{strings.Repeat("[ 1.000000] eth0: link up\n", 40) + "[ 9.0] watchdog: BUG: soft lockup - CPU#3 stuck for 22s! [nvidia-smi:4242]\n", KernelLog},
		{strings.Repeat("NVRM: Xid (PCI:0000:9b:00): 119, pid=1, name=nvidia-smi, Timeout after 45s of waiting for RPC response from GPU4 GSP!\n", 3) + "$ nvidia-smi\nNo devices were found\n", KernelLog},
		{"| NVIDIA-SMI 535.104.05             Driver Version: 535.104.05   CUDA Version: 12.2     |", NvidiaSMI},
		{"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", NvidiaSMI},
		{"No devices were found\n", NvidiaSMI},
		{"Conditions:\n  Type                 Status  LastHeartbeatTime                 LastTransitionTime                Reason                       Message\n  ----                 ------  -----------------                 ------------------                ------                       -------\n  KernelDeadlock       True    Tue, 01 Dec 2026 12:58:11 +0000   Tue, 01 Dec 2026 11:40:02 +0000   DockerHung                   kernel: INFO: task containerd:1882 blocked for more than 120 seconds.\n", RuntimeLog},
		{"Unable to determine the device handle for GPU0000:AA:00.0: Unknown Error\n", NvidiaSMI},
		// kubectl describe node: its Capacity/Allocatable blocks.
		{"Name:               node-a1\nCapacity:\n  cpu:  128\n  nvidia.com/gpu:  8\nAllocatable:\n  cpu:  128\n  nvidia.com/gpu:  7\n", KubectlDescribe},
		// Inputs in no format are said to be so, never read as a kernel log.
		{"apiVersion: v1\nkind: Node\nmetadata:\n  name: node-a1\nstatus:\n  capacity:\n    nvidia.com/gpu: \"8\"\n", Unrecognized},
		{"apiVersion: karpenter.sh/v1\nkind: NodeClaim\nmetadata:\n  name: gpu-abc\n", Unrecognized},
		{"Start-Date: 2021-04-24  06:50:54\nCommandline: /usr/bin/unattended-upgrade\nUpgrade: libnvidia-common-460:amd64 (460.56, 460.73.01)\nEnd-Date: 2021-04-24  06:50:54\n", Unrecognized},
		{"hello\nworld\n", Unrecognized},
		// A few kernel records among other text are still a kernel log.
		{"$ ssh node-a1\nlast login: yesterday\nnote: see below\nmore words here\n[ 12.000000] NVRM: Xid (PCI:0000:4e:00): 79, pid=1, GPU has fallen off the bus.\n", KernelLog},
	}
	for _, tt := range tests {
		if got := Sniff([]byte(tt.in)); got != tt.want {
			t.Errorf("Sniff(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestParseFormat(t *testing.T) {
	t.Parallel()
	for _, f := range Formats() {
		got, err := ParseFormat(string(f))
		if err != nil || got != f {
			t.Errorf("ParseFormat(%q) = %q, %v", f, got, err)
		}
	}
	for alias, want := range aliases {
		if got, err := ParseFormat(alias); err != nil || got != want {
			t.Errorf("ParseFormat(%q) = %q, %v; want %q", alias, got, err, want)
		}
	}
	if _, err := ParseFormat("xml"); !errors.Is(err, ErrUnknownFormat) {
		t.Errorf("ParseFormat(xml) error %v, want ErrUnknownFormat", err)
	}
}

// FuzzScan checks that no input crashes any parser.
func FuzzScan(f *testing.F) {
	for _, s := range []string{"| a | b |\n| | Fail - GPU: 0 |", `{"errorCode":["x"],"entitiesImpacted":[{`, "GPU 0: x\n Link 0: <inactive>",
		"DCGM_FI_DEV_XID_ERRORS{a=\"", "PLEG is not healthy: pleg was last seen active 9h ago; threshold is 3m0s"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, format := range []Format{NvidiaSMI, DcgmiDiag, Prometheus, JSONLog, RuntimeLog, KernelLog} {
			if _, err := Scan(context.Background(), bytes.NewReader(data), format, Options{}); err != nil {
				t.Fatalf("Scan %s: %v", format, err)
			}
		}
	})
}

// TestOldKernelStackFrames: kernels before 4.x print each frame after its
// address ("[<ffffffffa09c376e>] func+0x1e/0x40 [nvidia_uvm]"); a hung task
// stuck in the nvidia modules must still name them (blind trial: a RHEL 7
// style report was read as an OS event with no GPU frame).
func TestOldKernelStackFrames(t *testing.T) {
	t.Parallel()
	in := `[  721.028170] INFO: task nvc:[driver]:5403 blocked for more than 120 seconds.
[  721.028229]       Tainted: P           O    4.4.146-1.el7.elrepo.x86_64 #1
[  721.028273] "echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.
[  721.028346] Call Trace:
[  721.028360]  [<ffffffff8170e16e>] ? schedule_preempt_disabled+0xe/0x10
[  721.028368]  [<ffffffff8170de85>] schedule+0x35/0x80
[  721.028383]  [<ffffffff8170fd3f>] mutex_lock+0x1f/0x2f
[  721.028422]  [<ffffffffa09c376e>] uvm_gpu_retain_by_uuid+0x1e/0x40 [nvidia_uvm]
`
	res, err := Scan(context.Background(), strings.NewReader(in), Auto, Options{})
	if err != nil || len(res.Findings) != 1 {
		t.Fatalf("scan: %v, findings %+v", err, res.Findings)
	}
	if f := res.Findings[0]; f.Detector != "hung-task" || f.Attrs["module"] != "nvidia_uvm" {
		t.Fatalf("finding %s module %q, want hung-task in nvidia_uvm", f.Detector, f.Attrs["module"])
	}
}

// TestNotText: a gzipped or binary input is an error, never "0 findings".
func TestNotText(t *testing.T) {
	t.Parallel()
	for name, in := range map[string]string{"gzip": "\x1f\x8b\x08\x00\x00\x00\x00\x00", "binary": "ELF\x00\x01\x02"} {
		if _, err := Scan(context.Background(), strings.NewReader(in), Auto, Options{}); !errors.Is(err, ErrNotText) {
			t.Errorf("%s: err %v, want ErrNotText", name, err)
		}
	}
}

// TestBootTimeFromInput: a boot time saved with the log (btime of
// /proc/stat, "uptime -s", "who -b", or a syslog line carrying both
// times) places dmesg records; the flag wins over the input; the findings
// of an input without one are counted untimed.
func TestBootTimeFromInput(t *testing.T) {
	t.Parallel()
	xid := "[ 7510.129324] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
	boot := time.Date(2026, 2, 2, 20, 47, 1, 0, time.UTC)
	tests := []struct {
		name, in, source string
		opt              time.Time
		boot             time.Time
	}{
		{"btime of /proc/stat", "btime 1770065221\n" + xid, BootTimeBtime, time.Time{}, boot},
		{"uptime -s", "2026-02-02 20:47:01\n" + xid, BootTimeUptime, time.Time{}, boot},
		{"who -b", "         system boot  2026-02-02 20:47\n" + xid, BootTimeWho, time.Time{}, boot.Truncate(time.Minute)},
		{"a syslog line with both times", "Feb  2 20:48:01 node-a1 kernel: [   60.000000] pci 0000:3b:00.0: something\n" + xid, BootTimeRecord, time.Time{},
			time.Date(time.Now().Year(), 2, 2, 20, 47, 1, 0, time.UTC)},
		{"the flag wins", "btime 1\n" + xid, BootTimeFlag, boot, boot},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Scan(context.Background(), strings.NewReader(tt.in), Auto, Options{BootTime: tt.opt})
			if err != nil {
				t.Fatal(err)
			}
			if res.BootTimeSource != tt.source || !res.BootTime.Equal(tt.boot) {
				t.Fatalf("boot time %s from %q, want %s from %q", res.BootTime, res.BootTimeSource, tt.boot, tt.source)
			}
			var xids int
			for _, f := range res.Findings {
				if f.Detector != "xid" {
					continue
				}
				xids++
				if want := tt.boot.Add(7510129324 * time.Microsecond); !f.Time.Equal(want) {
					t.Errorf("xid at %s, want %s", f.Time, want)
				}
			}
			if xids != 1 || res.Untimed != 0 {
				t.Errorf("%d xid findings, %d untimed: %+v", xids, res.Untimed, res.Findings)
			}
		})
	}
	res, err := Scan(context.Background(), strings.NewReader(xid), Auto, Options{})
	if err != nil || res.Untimed != 1 || res.BootTimeSource != "" {
		t.Errorf("no boot time anywhere: err %v, untimed %d, source %q", err, res.Untimed, res.BootTimeSource)
	}
}
