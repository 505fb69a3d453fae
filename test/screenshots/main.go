// Command screenshots logs in to a running `fleetrepair-demo` with the
// demo's local login and writes a full-page PNG of every dashboard page to
// a folder (make screenshots: docs/screenshots). It drives Debian's
// Chromium through chromedp.
//
//	screenshots -url http://127.0.0.1:8080 -out docs/screenshots
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"time"

	"github.com/chromedp/chromedp"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "screenshots:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	base := flag.String("url", "http://127.0.0.1:8080", "the demo's URL")
	out := flag.String("out", "docs/screenshots", "folder for the PNGs")
	wait := flag.Duration("wait", 2*time.Minute, "how long to wait for the demo's held repairs")
	flag.Parse()
	chrome, err := exec.LookPath("chromium")
	if err != nil {
		return errors.New("needs Chromium: apt-get install -y chromium")
	}
	// The demo starts PostgreSQL first: wait for the controller.
	for up := time.Now().Add(time.Minute); ; {
		resp, err := http.Get(*base + "/livez")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(up) {
			return fmt.Errorf("the demo at %s did not come up: %w", *base, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", *out, err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1360, 900))
	actx, cancel := chromedp.NewExecAllocator(ctx, opts...)
	defer cancel()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	if err := chromedp.Do(bctx, chromedp.Navigate(*base+"/login"), chromedp.WaitVisible("#dev-login"), chromedp.Click("#dev-login"),
		chromedp.WaitVisible("#who")); err != nil {
		return fmt.Errorf("demo login at %s: %w", *base, err)
	}
	// The zone outage holds repairs: wait until the approvals page has some.
	deadline := time.Now().Add(*wait)
	for {
		n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`fetch("/api/v1/approvals").then(r => r.json()).then(a => a.total)`, chromedp.EvalAwaitPromise))
		if err != nil {
			return fmt.Errorf("read approvals: %w", err)
		}
		if n > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	pages := map[string]string{"fleet": "/fleet", "approvals": "/approvals", "breakers": "/breakers", "reasons": "/reasons", "history": "/history",
		"shadow": "/shadow?since=24h"}
	// A repair and a node from the approvals list.
	link, err := chromedp.Run(bctx, chromedp.Evaluate[string](`fetch("/api/v1/repairs?limit=1").then(r => r.json()).then(p => p.items.length ? p.items[0].id + "|" + p.items[0].cluster + "/" + p.items[0].node : "")`, chromedp.EvalAwaitPromise))
	if err != nil {
		return fmt.Errorf("read repairs: %w", err)
	}
	if m := regexp.MustCompile(`^(\d+)\|(.+)$`).FindStringSubmatch(link); m != nil {
		pages["repair"], pages["node"] = "/repairs/"+m[1], "/nodes/"+m[2]
	}
	for name, path := range pages {
		if err := chromedp.Do(bctx, chromedp.Navigate(*base+path), chromedp.WaitVisible("#live")); err != nil {
			return fmt.Errorf("open %s: %w", path, err)
		}
		// A live page shows its stream's state: wait until it is open.
		if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`!document.getElementById("live").dataset.events || document.getElementById("stream").textContent === "live"`,
			chromedp.WithPollingTimeout(10*time.Second))); err != nil {
			return fmt.Errorf("live stream of %s: %w", path, err)
		}
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			return fmt.Errorf("screenshot %s: %w", path, err)
		}
		f := filepath.Join(*out, name+".png")
		if err := os.WriteFile(f, png, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", f, err)
		}
		fmt.Println("wrote", f)
	}
	return nil
}
