package api

import (
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/go-chi/chi/v5"
	"sigs.k8s.io/yaml"
)

// routeQueries maps a route pattern ("/api/v1/repairs/{id}") and a method
// to the query parameters openapi.yaml declares for it. The document is the
// one list of a route's parameters: the handlers read those, the generated
// client sends those, and knownQuery refuses the others.
var routeQueries = sync.OnceValues(func() (map[string]map[string][]string, error) {
	var doc struct {
		Paths      map[string]map[string]openAPIOperation `json:"paths"`
		Components struct {
			Parameters map[string]openAPIParameter `json:"parameters"`
		} `json:"components"`
	}
	if err := yaml.Unmarshal(openAPIYAML, &doc); err != nil {
		return nil, fmt.Errorf("parse openapi.yaml: %w", err)
	}
	out := make(map[string]map[string][]string, len(doc.Paths))
	for path, ops := range doc.Paths {
		out[path] = map[string][]string{}
		for method, op := range ops {
			var names []string
			for _, p := range op.Parameters {
				if ref, ok := strings.CutPrefix(p.Ref, "#/components/parameters/"); ok {
					c, found := doc.Components.Parameters[ref]
					if !found {
						return nil, fmt.Errorf("parse openapi.yaml: %s %s: no parameter %s", method, path, p.Ref)
					}
					p.Name, p.In = c.Name, c.In
				}
				if p.In == "query" {
					names = append(names, p.Name)
				}
			}
			sort.Strings(names)
			out[path][strings.ToUpper(method)] = names
		}
	}
	return out, nil
})

// openAPIOperation is an operation of openapi.yaml, as far as knownQuery
// reads it.
type openAPIOperation struct {
	Parameters []openAPIParameter `json:"parameters"`
}

// openAPIParameter is a parameter of openapi.yaml: inline (name, in) or a
// $ref to components.parameters.
type openAPIParameter struct {
	Name string `json:"name"`
	In   string `json:"in"`
	Ref  string `json:"$ref"`
}

// knownQuery answers 400 "invalid query" for a query parameter the route
// does not declare in openapi.yaml (a typo such as ?stat=awaiting_approval
// would otherwise list every repair), and for one given more than once
// (?limit=1&limit=500: the handlers read only the first). It runs after
// routing (chi's inline middleware), where the route pattern is known; a
// route missing from the document is left alone (TestOpenAPIMatchesRouter
// keeps every route in it).
func knownQuery(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		routes, err := routeQueries()
		if err != nil {
			writeError(w, http.StatusInternalServerError, "openapi document unavailable", err.Error(), nil)
			return
		}
		pattern := ""
		if rc := chi.RouteContext(r.Context()); rc != nil {
			pattern = rc.RoutePattern()
		}
		allowed, ok := routes[pattern][r.Method]
		if !ok || r.URL.RawQuery == "" {
			next.ServeHTTP(w, r)
			return
		}
		var problems []string
		q := r.URL.Query()
		keys := make([]string, 0, len(q))
		for k := range q {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			switch {
			case !slices.Contains(allowed, k) && len(allowed) == 0:
				problems = append(problems, fmt.Sprintf("%s: unknown query parameter (%s takes none)", k, pattern))
			case !slices.Contains(allowed, k):
				problems = append(problems, fmt.Sprintf("%s: unknown query parameter (%s takes %s)", k, pattern, strings.Join(allowed, ", ")))
			case len(q[k]) > 1:
				problems = append(problems, fmt.Sprintf("%s: given %d times, at most once", k, len(q[k])))
			}
		}
		if len(problems) > 0 {
			writeError(w, http.StatusBadRequest, "invalid query", "", problems)
			return
		}
		next.ServeHTTP(w, r)
	})
}
