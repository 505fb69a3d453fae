package config_test

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/fleetrepair/fleetrepair/controller/config"
)

// TestExampleHasEveryKey: deploy/config.example.yaml, which docs/config.md
// calls the example with every key, holds every key of config.Config (its
// yaml tags, nested sections included); policy's own keys are
// docs/policy.md's, and policyFile, the alternative to an inline policy,
// must be named in a comment.
func TestExampleHasEveryKey(t *testing.T) {
	t.Parallel()
	const path = "../../deploy/config.example.yaml"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var example map[string]any
	if err := yaml.Unmarshal(data, &example); err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	var walk func(typ reflect.Type, in map[string]any, at string)
	walk = func(typ reflect.Type, in map[string]any, at string) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if key == "" || key == "-" {
				continue
			}
			v, ok := in[key]
			if !ok {
				if key == "policyFile" && strings.Contains(string(data), "# policyFile: ") {
					continue
				}
				t.Errorf("%s lacks %s%s", path, at, key)
				continue
			}
			if f.Type.Kind() == reflect.Struct && f.Type.PkgPath() == typ.PkgPath() {
				sub, _ := v.(map[string]any)
				walk(f.Type, sub, at+key+".")
			}
		}
	}
	walk(reflect.TypeFor[config.Config](), example, "")
	if _, err := config.Load(path, nil); err != nil {
		t.Errorf("the example does not load: %v", err)
	}
}
