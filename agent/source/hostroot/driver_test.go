package hostroot

import (
	"os"
	"path/filepath"
	"testing"
)

func TestDriverVersions(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(p, s string) {
		t.Helper()
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r := Root(dir)
	if m, l := r.DriverVersions(); m != "" || l != "" {
		t.Fatalf("empty root: %q %q", m, l)
	}
	write("/proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  460.56  Tue Feb 23 23:23:44 UTC 2021\nGCC version:  gcc version 9.3.0\n")
	write("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.460.73.01", "")
	write("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.460.9.1", "")
	write("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "")
	if m, l := r.DriverVersions(); m != "460.56" || l != "460.73.01" {
		t.Errorf("got module %q library %q, want 460.56 460.73.01", m, l)
	}
	write("/proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build  (builder@build-host)  Mon Jun  2 13:13:04 UTC 2025\n")
	if m, _ := r.DriverVersions(); m != "570.158.01" {
		t.Errorf("open module: %q", m)
	}
}
