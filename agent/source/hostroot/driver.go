package hostroot

import (
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Where NVIDIA's installers and distribution packages put libnvidia-ml
// (Debian/Ubuntu multiarch, RHEL lib64, the runfile's /usr/lib, GPU
// Operator driver containers' /run/nvidia/driver root).
var nvmlLibDirs = []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
	"/run/nvidia/driver/usr/lib/x86_64-linux-gnu", "/run/nvidia/driver/usr/lib64"}

var (
	// moduleVersionRE reads /proc/driver/nvidia/version's first line:
	// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 ..."
	// or "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build ...".
	moduleVersionRE = regexp.MustCompile(`NVRM version: NVIDIA UNIX .*?Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)`)
	libVersionRE    = regexp.MustCompile(`libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$`)
)

// DriverVersions returns the version of the loaded NVIDIA kernel module
// (/proc/driver/nvidia/version; "" when no module is loaded) and of the
// user-space NVML library on disk (the libnvidia-ml.so.<version> file name;
// "" when none is installed, the highest when several are). They differ
// after a user-space upgrade under a loaded module: every new NVML client
// then fails with "Driver/library version mismatch". Neither needs NVML, so
// they are known exactly when NVML cannot initialise.
func (r Root) DriverVersions() (module, library string) {
	if s, err := r.ReadString("/proc/driver/nvidia/version"); err == nil {
		if m := moduleVersionRE.FindStringSubmatch(s); m != nil {
			module = m[1]
		}
	}
	var libs []string
	for _, dir := range nvmlLibDirs {
		matches, _ := filepath.Glob(r.Path(filepath.Join(dir, "libnvidia-ml.so.*")))
		for _, p := range matches {
			if m := libVersionRE.FindStringSubmatch(filepath.Base(p)); m != nil {
				libs = append(libs, m[1])
			}
		}
	}
	if len(libs) > 0 {
		slices.SortFunc(libs, compareVersions)
		library = libs[len(libs)-1]
	}
	return module, library
}

// compareVersions orders dotted numeric versions ("535.104.05" < "550.54.14").
func compareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(pa) && i < len(pb); i++ {
		x, _ := strconv.Atoi(pa[i])
		y, _ := strconv.Atoi(pb[i])
		if x != y {
			return x - y
		}
	}
	return len(pa) - len(pb)
}
