package api_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/web/api"
)

// serve runs api.NewServer(h, o) on a free loopback port.
func serve(t *testing.T, h http.Handler, o api.ServerOptions) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := api.NewServer(h, o)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// TestSlowBodyIsCutOff: a client that sends its headers and then trickles
// the body is disconnected at ReadTimeout, and the handler sees a read
// error, not a request held for ever (issue 11: 3,000 slow-body connections
// were held 90 s).
func TestSlowBodyIsCutOff(t *testing.T) {
	t.Parallel()
	readErr := make(chan error, 1)
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		readErr <- err
	}), api.ServerOptions{ReadTimeout: 300 * time.Millisecond})
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /api/v1/reports HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
	stop := make(chan struct{})
	defer close(stop)
	go func() { // one byte every 50 ms: never idle long enough for an idle timeout
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				if _, err := conn.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	select {
	case err := <-readErr:
		if err == nil {
			t.Fatal("the slow body was read to the end")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a slow body held the request past ten times ReadTimeout")
	}
}

// TestHugeHeaderIsRefused: headers beyond MaxHeaderBytes are answered 431
// without reaching a handler.
func TestHugeHeaderIsRefused(t *testing.T) {
	t.Parallel()
	reached := false
	addr := serve(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = true }), api.ServerOptions{})
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /livez HTTP/1.1\r\nHost: x\r\nX-Junk: %s\r\n\r\n", strings.Repeat("a", 1<<20))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || reached {
		t.Fatalf("1 MiB header: %d (handler reached: %v), want 431", resp.StatusCode, reached)
	}
}
