package kubelet

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		handler http.HandlerFunc
		states  []string
		wedges  []int
	}{
		{"healthy", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }, []string{"ok", "ok"}, []int{0, 0}},
		{"unhealthy", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "[-]syncloop failed", 500) },
			[]string{"ok", "failing", "failing"}, []int{0, 1, 0}},
		{"refused", nil, []string{"unknown", "unknown"}, []int{0, 0}},
		{"hangs", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }, []string{"ok", "failing"}, []int{0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(tt.handler)
			url := srv.URL + "/healthz"
			if tt.handler == nil {
				srv.Close() // nothing listens any more
			} else {
				defer srv.Close()
			}
			m := New(Options{URL: url, Timeout: 100 * time.Millisecond})
			for i, want := range tt.states {
				res := m.Check(context.Background())
				if res.State != want || len(res.Findings) != tt.wedges[i] {
					t.Errorf("check %d: %q (%s) %d findings; want %q %d", i, res.State, res.Reason, len(res.Findings), want, tt.wedges[i])
				}
			}
		})
	}
}
