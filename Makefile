# fleetrepair — see README.md. `make demo` runs the main job, `make test` the tests.
GO      ?= go
BIN     := bin
PKGS    := ./...

.PHONY: all build test test-race demo screenshots generate verify fmt vet bench load faults clean fuzz

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

## demo: self-contained demo (throwaway PostgreSQL, simulated fleet, real agents)
demo:
	$(GO) build -o $(BIN)/ ./cmd/fleetrepair ./cmd/fleetrepair-demo
	./$(BIN)/fleetrepair-demo $(DEMO_ARGS)

## screenshots: a PNG of every dashboard page from the demo into docs/screenshots (needs Chromium)
SHOTS_ADDR ?= 127.0.0.1:18081
screenshots:
	$(GO) build -o $(BIN)/ ./cmd/fleetrepair-demo ./test/screenshots
	@./$(BIN)/fleetrepair-demo --listen $(SHOTS_ADDR) >/tmp/fleetrepair-screenshots-demo.log 2>&1 & pid=$$!; \
	  ./$(BIN)/screenshots -url http://$(SHOTS_ADDR) -out docs/screenshots; rc=$$?; kill -INT $$pid; wait $$pid; exit $$rc

## test: every test, on a real PostgreSQL (DATABASE_URL, a testcontainers-go container, or a throwaway local cluster)
test: kube-tools
	$(GO) test -count=1 -timeout 20m $(PKGS)

## test-race: the concurrent packages under the race detector
test-race:
	$(GO) test -race -count=1 ./agent/... ./controller/...

## generate: Go constants and docs/reasons.md from controller/catalog/reasons.yaml; the API's Go
## client (web/apiclient/oapi/client.gen.go) from web/api/openapi.yaml with oapi-codegen (go.mod's tool)
generate:
	$(GO) generate ./controller/catalog ./web/apiclient/oapi

## verify: formatting, vet, and generated files up to date (the agent's import rule is a test: test/importrule)
verify: fmt vet
	@$(GO) test -count=1 -run 'TestGeneratedFilesUpToDate' ./controller/catalog ./web/apiclient/oapi >/dev/null || { echo "generated files drifted: run make generate"; exit 1; }

fmt:
	@out="$$(gofmt -l . )"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

## fuzz: every Go fuzz target for FUZZTIME each (make test runs their seed corpora; a crasher
## is written to the package's testdata/fuzz and stays there as a seed: commit it with the fix)
FUZZTIME ?= 30s
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for fn in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz' || true); do \
	    echo "== fuzz $$pkg $$fn ($(FUZZTIME))"; \
	    $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) -parallel 2 $$pkg; \
	  done; \
	done

## bench: benchmarks (figures go in the issue notes, never asserted in tests)
bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

## load: the fleet load harness (test/load, docs/scale.md): real controller binary (two replicas,
## the leader SIGKILLed mid-wave), PostgreSQL (stopped for LOAD_PG_OUTAGE), a kube-apiserver with
## LOAD_NODES Nodes and NodeClaims, one simulated agent per node; prints the figures and writes them
## to bin/load-$(LOAD_NODES).txt. A benchmark, not part of `make test` (TestLoadSmoke is).
## LOAD_CLUSTERS > 1 is the fleet scenario: that many API servers, steady heartbeats only, e.g.
## `make load LOAD_CLUSTERS=50 LOAD_NODES=100000 LOAD_REPLICAS=1`; LOAD_PROFILE=dir records the
## controller with perf in the steady phase. The controller is built first (not during setup, where
## it competed with the API servers for the CPU). The harness prints its pprof address at start, its
## own RSS every 30 s and each phase's figures as the phase ends (also into bin/load-$(LOAD_NODES).txt),
## and writes a heap profile of itself every LOAD_HEAP_EVERY into the logs folder. Every LOAD_* value
## is passed on as its -load.* flag (docs/scale.md "Commands"); a value the run cannot use
## (LOAD_NODES=0, LOAD_NODES=abc, LOAD_REPLICAS=3, ...) is refused before anything is built, by the
## benchmark's own rules (test/load/checkflags), one line naming each bad variable. LOAD_PG_OUTAGE=0 (or
## negative) runs no PostgreSQL outage; LOAD_DB_POOL=0 leaves the controller's own pool size (32);
## LOAD_AGENT_RAMP starts the agents evenly over that long (0: one heartbeat, or 3 ms per agent when longer).
## LOAD_LEASE sets the replicas' Lease duration (0: the controller's 15s), so the failover after the leader is killed can be measured.
## LOAD_KILL_AT is when the leader is killed after the wave's first failing report (1.5s; 0: before the old leader can trip the breaker).
LOAD_NODES      ?= 1000
LOAD_CLUSTERS   ?= 1
LOAD_FIRST_NODES ?= 0
LOAD_PROFILE    ?=
LOAD_REPLICAS   ?= 2
LOAD_ZONES      ?= 4
LOAD_HEARTBEAT  ?= 30s
LOAD_WORKERS    ?= 16
LOAD_STEADY     ?= 60s
LOAD_PG_OUTAGE  ?= 60s
LOAD_TOLERATION ?= 30s
LOAD_DB_POOL    ?= 32
LOAD_HEAP_EVERY ?= 5m
LOAD_AGENT_RAMP ?= 0
LOAD_LEASE ?= 0
LOAD_KILL_AT ?= 1.5s
# The -load.* flag of each LOAD_* value (test/load/flags.go's makeVars names them back).
LOAD_ARGS = -load.nodes=$(LOAD_NODES) -load.clusters=$(LOAD_CLUSTERS) -load.first-cluster-nodes=$(LOAD_FIRST_NODES) \
	-load.profile=$(LOAD_PROFILE) -load.replicas=$(LOAD_REPLICAS) -load.workers=$(LOAD_WORKERS) -load.zones=$(LOAD_ZONES) \
	-load.heartbeat=$(LOAD_HEARTBEAT) -load.steady=$(LOAD_STEADY) -load.pg-outage=$(LOAD_PG_OUTAGE) \
	-load.toleration=$(LOAD_TOLERATION) -load.db-pool=$(LOAD_DB_POOL) -load.heap-every=$(LOAD_HEAP_EVERY) \
	-load.agent-ramp=$(LOAD_AGENT_RAMP) -load.lease-duration=$(LOAD_LEASE) -load.kill-at=$(LOAD_KILL_AT)
load:
	@mkdir -p $(BIN)
	@$(GO) build -o $(BIN)/load-checkflags ./test/load/checkflags && ./$(BIN)/load-checkflags $(LOAD_ARGS)
	$(GO) build -o $(BIN)/fleetrepair ./cmd/fleetrepair
	$(GO) test ./test/load -run '^$$' -bench '^BenchmarkLoad$$' -benchtime 1x -timeout 120m -args -load.binary=$(CURDIR)/$(BIN)/fleetrepair \
		$(LOAD_ARGS) -load.out=$(CURDIR)/$(BIN)/load-$(LOAD_NODES).txt -load.logs=$(CURDIR)/$(BIN)/load-logs-$(LOAD_NODES)

## faults: the full fault-injection suite (test/load/faults.go, docs/faults.md): cmd/fleetrepair with
## TokenReview against a kube-apiserver, PostgreSQL stopped for FAULTS_PG_OUTAGE with agents killed and
## restarted meanwhile, FAULTS_SLOW_CONNS slow-body connections, FAULTS_BAD_TOKEN_RPS garbage tokens per
## second, the controller SIGKILLed at every step of a repair; asserts the invariants and writes the
## figures to bin/faults.txt. `make test` runs its smoke (TestFaultsSmoke).
FAULTS_NODES         ?= 100
FAULTS_PG_OUTAGE     ?= 60s
FAULTS_SLOW_CONNS    ?= 3000
FAULTS_BAD_TOKEN_RPS ?= 200
faults: kube-tools
	@mkdir -p $(BIN)
	$(GO) test ./test/load -run '^TestFaults$$' -count=1 -v -timeout 40m -args -faults \
		-faults.nodes=$(FAULTS_NODES) -faults.pg-outage=$(FAULTS_PG_OUTAGE) -faults.slow-conns=$(FAULTS_SLOW_CONNS) \
		-faults.bad-token-rps=$(FAULTS_BAD_TOKEN_RPS) -faults.out=$(CURDIR)/$(BIN)/faults.txt

## bench-agent: agent CPU/RSS/wake-ups idle and under a 5,000 lines/s /dev/kmsg flood,
## side by side with node-problem-detector's kernel monitor (root, Linux; builds NPD into .tools/)
NPD_VERSION ?= v1.34.0
bench-agent:
	$(GO) build -o .tools/bin/fleetrepair-agent ./cmd/fleetrepair-agent
	@test -x .tools/bin/node-problem-detector || ( mkdir -p .tools/npd && cd .tools/npd && \
		printf 'module fleetrepair.local/npdbuild\n\ngo 1.26.8\n\nrequire k8s.io/node-problem-detector $(NPD_VERSION)\n' > go.mod && \
		printf '//go:build tools\n\npackage npdbuild\n\nimport _ "k8s.io/node-problem-detector/cmd/nodeproblemdetector"\n' > tools.go && \
		$(GO) mod tidy && $(GO) build -o ../bin/node-problem-detector k8s.io/node-problem-detector/cmd/nodeproblemdetector )
	$(GO) run ./test/agentbench $(BENCH_FLAGS)

clean:
	rm -rf $(BIN)

## kube-tools: kube-apiserver, etcd, helm and promtool for the Kubernetes and alert tests (test/envtest, test/kubeapi), built once
## from the Go module proxy into .tools/kube by their own modules under test/tools; rebuilt only when a version changes
.PHONY: kube-tools
kube-tools:
	bash test/tools/build.sh .tools/kube

## images: the controller and agent images for linux/amd64 and linux/arm64 (docker buildx;
## PUSH=1 pushes to REGISTRY). The agent's tag carries its DCGM major version (-dcgm4).
VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REGISTRY   ?= ghcr.io/fleetrepair
PLATFORMS  ?= linux/amd64,linux/arm64
DCGM_MAJOR ?= 4
.PHONY: images
images:
	docker buildx build --platform $(PLATFORMS) -f deploy/Dockerfile.controller \
		-t $(REGISTRY)/fleetrepair:$(VERSION) $(if $(PUSH),--push,) .
	docker buildx build --platform $(PLATFORMS) -f deploy/Dockerfile.agent \
		--build-arg VERSION=$(VERSION) --build-arg DCGM_MAJOR=$(DCGM_MAJOR) $(if $(DCGM_VERSION),--build-arg DCGM_VERSION=$(DCGM_VERSION),) \
		-t $(REGISTRY)/fleetrepair-agent:$(VERSION)-dcgm$(DCGM_MAJOR) $(if $(PUSH),--push,) .
