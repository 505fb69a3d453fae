// Command gen writes reasons_gen.go and docs/reasons.md from reasons.yaml.
// Run it with `make generate` (go generate ./controller/catalog); the
// catalog tests fail when the committed files drift from the YAML.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/fleetrepair/fleetrepair/controller/catalog"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

// run is executed by go generate in controller/catalog.
func run() error {
	c := catalog.Default()
	src, err := catalog.GenerateGo(c)
	if err != nil {
		return err
	}
	if err := os.WriteFile("reasons_gen.go", src, 0o644); err != nil {
		return fmt.Errorf("write reasons_gen.go: %w", err)
	}
	doc := filepath.Join("..", "..", "docs", "reasons.md")
	if err := os.WriteFile(doc, catalog.GenerateMarkdown(c), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", doc, err)
	}
	return nil
}
