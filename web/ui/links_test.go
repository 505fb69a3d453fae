package ui_test

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

var hrefRE = regexp.MustCompile(`href="([^"]*)"`)

// TestEveryLinkIsAURL: the repair page and /reasons show a reason's
// runbook (the catalog's prose) as text and link only real places: every
// href is a path of the dashboard, a fragment or an absolute URL, never
// text turned into a relative link.
func TestEveryLinkIsAURL(t *testing.T) {
	srv, st := newPlain(t, true)
	c := client(t)
	if code, _ := post(t, c, srv.URL+"/auth/dev", url.Values{"name": {"a"}, "role": {"viewer"}}); code != http.StatusOK {
		t.Fatalf("login: %d", code)
	}
	reason, ok := catalog.Default().Lookup("GPULost")
	if !ok {
		t.Fatal("catalog has no GPULost")
	}
	rp, _, err := st.OpenRepair(context.Background(), store.Repair{Cluster: "c1", Node: "gpu-1", NodePool: "gpu",
		Reason: "GPULost", FaultClass: "gpu-lost", RecommendedAction: "replace", State: ledger.Detected},
		"controller", "opened", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, page := range []string{"/reasons", "/repairs/" + strconv.FormatInt(rp.ID, 10)} {
		resp, err := c.Get(srv.URL + page)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body := string(b)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d\n%s", page, resp.StatusCode, body)
		}
		if !strings.Contains(html.UnescapeString(body), reason.Runbook) {
			t.Errorf("%s does not show the runbook text %q", page, reason.Runbook)
		}
		for _, m := range hrefRE.FindAllStringSubmatch(body, -1) {
			href := html.UnescapeString(m[1])
			u, err := url.Parse(href)
			switch {
			case err != nil, strings.ContainsAny(href, " \t"), strings.Contains(href, "%20"):
				t.Errorf("%s: href %q is not a URL", page, href)
			case u.Scheme == "" && !strings.HasPrefix(href, "/") && !strings.HasPrefix(href, "#"):
				t.Errorf("%s: href %q is relative text, not a path of the dashboard", page, href)
			}
		}
	}
	resp, err := c.Get(srv.URL + "/repairs/" + strconv.FormatInt(rp.ID, 10))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `href="/reasons#reason-GPULost"`) {
		t.Errorf("repair page links no reason page:\n%s", b)
	}
}
