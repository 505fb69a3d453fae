package nvsmi

import (
	"slices"
	"strings"
	"testing"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

func TestParse(t *testing.T) {
	t.Parallel()
	const q = `==============NVSMI LOG==============

GPU 00000000:3B:00.0
    Product Name                          : NVIDIA A100-SXM4-80GB
    Retired Pages
        Single Bit ECC                    : 2
        Double Bit ECC                    : 1
        Pending Page Blacklist            : No
    Remapped Rows
        Correctable Error                 : 0
        Uncorrectable Error               : 2
        Pending                           : Yes
        Remapping Failure Occurred        : Yes
    Temperature
        GPU Current Temp                  : 34 C

GPU 00000000:3C:00.0
    Remapped Rows
        Correctable Error                 : 0
        Uncorrectable Error               : 0
        Pending                           : No
        Remapping Failure Occurred        : No
    Retired Pages
        Single Bit ECC                    : 0
        Double Bit ECC                    : 3
        Pending Page Blacklist            : Yes
`
	tests := []struct {
		name string
		in   string
		want []string // "detector gpu attr=value..." of each finding, in order
	}{
		{"lost GPU", "Unable to determine the device handle for GPU 0000:C1:00.0: GPU is lost.  Reboot the system to recover this GPU\n",
			[]string{"nvml-error 0000:c1:00.0 error=GPU is lost"}},
		{"unknown error, 8-digit domain", "Unable to determine the device handle for GPU 00000000:09:00.0: Unknown Error\n",
			[]string{"nvml-error 0000:09:00.0 error=Unknown Error"}},
		{"bus ID glued to GPU", "Unable to determine the device handle for GPU0000:AA:00.0: Unknown Error\n",
			[]string{"nvml-error 0000:aa:00.0 error=Unknown Error"}},
		{"bus ID glued to GPU, lost", "Unable to determine the device handle for GPU00000000:1B:00.0: GPU is lost.  Reboot the system to recover this GPU\n",
			[]string{"nvml-error 0000:1b:00.0 error=GPU is lost"}},
		{"driver not loaded", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n",
			[]string{"nvml-error  error=NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"}},
		{"nvml init", "Failed to initialize NVML: Driver/library version mismatch\n",
			[]string{"driver-version-mismatch  error=Driver/library version mismatch source=nvidia-smi"}},
		{"nvml init with library version", "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 570.195\n",
			[]string{"driver-version-mismatch  error=Driver/library version mismatch nvml_library_version=570.195 source=nvidia-smi"}},
		{"nvml other init error", "Failed to initialize NVML: Unknown Error\n",
			[]string{"nvml-error  error=Unknown Error"}},
		{"fabric not completed", "GPU 00000000:4C:00.0\n    Fabric\n        State                             : In Progress\n        Status                            : N/A\n    Processes : None\n",
			[]string{"fabric-state 0000:4c:00.0 state=in progress status=N/A"}},
		{"fabric completed", "GPU 00000000:4C:00.0\n    Fabric\n        State                             : Completed\n        Status                            : Success\n",
			nil},
		{"all links inactive", "NVML:Unable to retrieve Nvlink information as all links are inActive\n",
			[]string{"nvlink-inactive  scope=all-links"}},
		{"-q blocks", q, []string{
			"row-remap-failure 0000:3b:00.0 correctable_rows=0 uncorrectable_rows=2",
			"row-remap-pending 0000:3b:00.0 correctable_rows=0 pending=true uncorrectable_rows=2",
			"retired-pages 0000:3c:00.0 dbe_pages=3 pending=true sbe_pages=0",
		}},
		{"nvlink all active", "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n\t Link 0: 26.562 GB/s\n\t Link 1: 26.562 GB/s\n", nil},
		{"nvlink two GPUs", "GPU 0: A (UUID: GPU-a)\n Link 0: <inactive>\n Link 1: 20 GB/s\n Link 2: 10.5 GB/s\nGPU 1: A (UUID: GPU-b)\n Link 0: 20 GB/s\n", []string{
			"nvlink-inactive  active_link_speed_gbps=10.5 gpu_index=0 gpu_uuid=GPU-a links=0 model=A"}},
		{"noise", "Mon Nov 30 12:00:00 2026\n+-----------------------------------------------------------------------------+\n| NVIDIA-SMI 550.90.07 |\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fs, _, err := Parse(strings.NewReader(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, f := range fs {
				got = append(got, describe(f))
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
		})
	}
}

// describe renders a finding as "detector gpu k=v..." with sorted keys.
func describe(f finding.Finding) string {
	s := f.Detector + " " + f.GPUPCI
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
