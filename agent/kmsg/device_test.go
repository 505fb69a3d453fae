package kmsg

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestDeviceReopenResumes: a Device opened again after its Reader ended
// delivers only records after the last one it delivered, and counts a gap
// across the reopen as lost.
func TestDeviceReopenResumes(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "kmsg")
	if err := os.WriteFile(path, []byte("6,1,10,-;a\n6,2,20,-;b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := &Device{Options: ReaderOptions{Path: path}}
	read := func() []string {
		t.Helper()
		if err := d.Open(); err != nil {
			t.Fatal(err)
		}
		out := make(chan Record, 16)
		if err := d.Run(context.Background(), out); err != nil {
			t.Fatal(err)
		}
		close(out)
		var got []string
		for r := range out {
			got = append(got, r.Message)
		}
		return got
	}
	if got := read(); len(got) != 2 {
		t.Fatalf("first open: %v", got)
	}
	if err := os.WriteFile(path, []byte("6,1,10,-;a\n6,2,20,-;b\n6,5,50,-;e\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := read(); len(got) != 1 || got[0] != "e" {
		t.Errorf("reopened: %v, want only the new record e", got)
	}
	if n := d.Lost(); n != 2 {
		t.Errorf("Lost = %d, want 2 (sequence 3 and 4)", n)
	}
	if err := (&Device{Options: ReaderOptions{Path: filepath.Join(t.TempDir(), "none")}}).Open(); err == nil {
		t.Error("Open of a missing path: no error")
	}
}
