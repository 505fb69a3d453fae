package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestServeProfiling: the pprof index and a goroutine dump are served on
// the profiling listener, and stop closes it.
func TestServeProfiling(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	stop, err := serveProfiling(context.Background(), addr, slog.New(slog.DiscardHandler))
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
	stop()
	if _, err := serveProfiling(context.Background(), "256.0.0.1:1", slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "--profiling-listen 256.0.0.1:1") {
		t.Errorf("a bad address: err = %v, want one naming the flag and the address", err)
	}
}
