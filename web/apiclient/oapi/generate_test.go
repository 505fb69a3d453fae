package oapi_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGeneratedFilesUpToDate: client.gen.go is what oapi-codegen (the
// version go.mod's tool directive pins) generates from web/api/openapi.yaml
// now; else run `make generate`.
func TestGeneratedFilesUpToDate(t *testing.T) {
	out := filepath.Join(t.TempDir(), "client.gen.go")
	cmd := exec.Command("go", "tool", "oapi-codegen", "-config", "oapi-codegen.yaml", "-o", out, "../../api/openapi.yaml")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go tool oapi-codegen: %v\n%s", err, b)
	}
	want, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("client.gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("web/apiclient/oapi/client.gen.go is out of date with web/api/openapi.yaml: run `make generate`")
	}
}
