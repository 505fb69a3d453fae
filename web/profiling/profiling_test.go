package profiling

import (
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// TestServe: a goroutine dump is served on the address returned, the
// listener closes when ctx ends, and a bad address is an error naming it.
func TestServe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := Serve(ctx, "127.0.0.1:0", func(err error) { t.Errorf("serve: %v", err) })
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "goroutine profile:") {
		t.Fatalf("goroutine dump: %s %q", resp.Status, body[:min(len(body), 200)])
	}
	// The command line holds secrets (--database-url, --agent-token).
	if resp, err := http.Get("http://" + addr + "/debug/pprof/cmdline"); err != nil {
		t.Fatal(err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), os.Args[0]) {
			t.Errorf("/debug/pprof/cmdline served the command line: %q", body)
		}
	}
	cancel()
	closed := false
	for i := 0; i < 500 && !closed; i++ { // a liveness bound, not a timing
		c := &http.Client{Timeout: time.Second}
		if _, err := c.Get("http://" + addr + "/debug/pprof/"); err != nil {
			closed = true
		} else {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if !closed {
		t.Error("still serving after ctx ended")
	}
	if _, err := Serve(context.Background(), "256.0.0.1:1", nil); err == nil || !strings.Contains(err.Error(), "256.0.0.1:1") {
		t.Errorf("a bad address: err = %v, want one naming it", err)
	}
}
