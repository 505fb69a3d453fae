# fleetrepair — see README.md. `make demo` runs the main job, `make test` the tests.
GO      ?= go
BIN     := bin
PKGS    := ./...

.PHONY: all build test test-race demo generate verify fmt vet bench clean

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

## demo: self-contained demo (throwaway PostgreSQL, simulated fleet, real agents)
demo:
	$(GO) run ./cmd/fleetrepair demo

## test: every test, on a real PostgreSQL (DATABASE_URL, or a throwaway local cluster)
test:
	$(GO) test -count=1 -timeout 20m $(PKGS)

## test-race: the concurrent packages under the race detector
test-race:
	$(GO) test -race -count=1 ./agent/... ./controller/...

## generate: Go constants and docs/reasons.md from controller/catalog/reasons.yaml
generate:
	$(GO) generate ./controller/catalog

## verify: formatting, vet, and generated files up to date (the agent's import rule is a test: test/importrule)
verify: fmt vet
	@$(GO) test -count=1 -run 'TestGeneratedFilesUpToDate' ./controller/catalog >/dev/null || { echo "generated files drifted: run make generate"; exit 1; }

fmt:
	@out="$$(gofmt -l . )"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

## bench: benchmarks (figures go in the issue notes, never asserted in tests)
bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

clean:
	rm -rf $(BIN)
