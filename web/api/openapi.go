package api

import (
	_ "embed"
	"fmt"
	"net/http"
	"sync"

	"sigs.k8s.io/yaml"
)

// openAPIYAML is the OpenAPI 3 document of this API (openapi.yaml, the
// source the Go client web/apiclient is generated from).
//
//go:embed openapi.yaml
var openAPIYAML []byte

var openAPIJSON = sync.OnceValues(func() ([]byte, error) {
	b, err := yaml.YAMLToJSON(openAPIYAML)
	if err != nil {
		return nil, fmt.Errorf("convert openapi.yaml to JSON: %w", err)
	}
	return b, nil
})

// OpenAPI returns the API's OpenAPI 3 document as JSON, the body of GET
// /api/v1/openapi.json. The error is only a malformed embedded document,
// which TestOpenAPIMatchesRouter catches.
func OpenAPI() ([]byte, error) { return openAPIJSON() }

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	b, err := OpenAPI()
	if err != nil {
		writeError(w, http.StatusInternalServerError, "openapi document unavailable", err.Error(), nil)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	_, _ = w.Write(b)
}
