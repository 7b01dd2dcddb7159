# pgworker — `make help` lists the targets.

GO        ?= go
BIN       := $(CURDIR)/bin
GOOSE_VERSION := v3.30.0
MINIO_VERSION := v0.0.0-20260212201848-7aac2a2c5b7c
STATICCHECK_VERSION := v0.8.2
UPLOT_VERSION := 1.6.32
DASHBOARD_VENDOR := $(CURDIR)/dashboard/static/vendor
TEST_FLAGS ?=
WITH_SERVICES := $(GO) run ./internal/cmd/withservices --
# make bench measures commits as production makes them (fsync on), and loads
# pg_stat_statements for the database CPU breakdown.
BENCH_SETTINGS ?= --setting 'fsync = on' --setting 'full_page_writes = on' \
	--setting "shared_preload_libraries = 'pg_stat_statements'"

export PATH := $(BIN):$(PATH)

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build bin/pgworker
	$(GO) build -o $(BIN)/pgworker ./cmd/pgworker

.PHONY: demo
demo: build ## Run it all on this machine: PostgreSQL, MinIO (when bin/minio exists), the dashboard, 3 workers, the sample data set
	$(GO) run ./internal/cmd/demo --pgworker $(BIN)/pgworker

.PHONY: test
test: tools ## Run all tests with -race against throwaway PostgreSQL and MinIO servers, and deploy/check's
	$(WITH_SERVICES) sh -c '$(GO) test -race -count=1 -timeout 15m $(TEST_FLAGS) ./... && cd deploy/check && $(GO) test -count=1 -timeout 15m $(TEST_FLAGS) ./...'

.PHONY: test-deploy
test-deploy: ## Check the Kubernetes, KEDA, Docker, Prometheus and Grafana files (the module deploy/check) against a throwaway PostgreSQL
	$(WITH_SERVICES) sh -c 'cd deploy/check && $(GO) test -count=1 -timeout 15m $(TEST_FLAGS) ./...'

.PHONY: test-short
test-short: ## Run the tests without the slow ones (-short)
	$(WITH_SERVICES) $(GO) test -race -count=1 -short $(TEST_FLAGS) ./...

.PHONY: test-faults
test-faults: tools ## Run the fault suite in full (kill -9, restarts, partition, PgBouncer, failover, MinIO, disk) and write FAULTS.md
	$(WITH_SERVICES) $(GO) test -race -count=1 -timeout 60m -v $(TEST_FLAGS) ./faults -args -faults.full -faults.report=$(CURDIR)/FAULTS.md

.PHONY: bench
bench: tools ## Run every pgworker bench mode and the River peer benchmark on throwaway PostgreSQL and MinIO; write BENCHMARKS.md
	$(GO) run ./internal/cmd/withservices $(BENCH_SETTINGS) --minio --bucket pgworker-bench -- ./bench/run.sh

.PHONY: bench-go
bench-go: ## Run the Go benchmarks (go test -bench)
	$(WITH_SERVICES) $(GO) test -run '^$$' -bench . -benchmem ./...

.PHONY: bench-peers
bench-peers: ## Run the River peer benchmark (bench/peers) alone on a throwaway PostgreSQL
	$(WITH_SERVICES) sh -c 'cd bench/peers && ./run.sh --database-url "$$TEST_DATABASE_URL"'

.PHONY: lint
lint: ## gofmt, go vet and staticcheck
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt: the files above need formatting"; exit 1; }
	$(GO) vet ./...
	cd deploy/check && $(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	cd deploy/check && $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

.PHONY: schema
schema: ## Check that sql/schema.sql builds the same catalog as migrations/
	$(WITH_SERVICES) $(GO) test -count=1 -run 'TestSchemaFileMatchesMigrations|TestSharedNames' ./migrations/

.PHONY: tools
tools: $(BIN)/goose $(BIN)/minio ## Install pinned goose and MinIO binaries into ./bin

$(BIN)/goose:
	GOBIN=$(BIN) $(GO) install github.com/pressly/goose/v3/cmd/goose@$(GOOSE_VERSION)

$(BIN)/minio:
	GOBIN=$(BIN) $(GO) install github.com/minio/minio@$(MINIO_VERSION)

.PHONY: assets
assets: ## Vendor the dashboard's charting library (uPlot, pinned) from the npm registry into dashboard/static/vendor
	@command -v npm >/dev/null || { echo "assets: npm is needed (Debian package npm)"; exit 1; }
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	cd "$$tmp"; npm pack --silent uplot@$(UPLOT_VERSION) >/dev/null; \
	tar xzf uplot-$(UPLOT_VERSION).tgz; \
	took=$$(node -p 'require("./package/package.json").version'); \
	test "$$took" = "$(UPLOT_VERSION)" || { echo "assets: npm gave uplot $$took, not $(UPLOT_VERSION)"; exit 1; }; \
	mkdir -p $(DASHBOARD_VENDOR); \
	cp package/dist/uPlot.iife.min.js package/dist/uPlot.min.css $(DASHBOARD_VENDOR)/; \
	cp package/LICENSE $(DASHBOARD_VENDOR)/uPlot.LICENSE; \
	sum=$$(sha256sum uplot-$(UPLOT_VERSION).tgz | cut -d' ' -f1); \
	printf '# Written by make assets: the packages vendored here, from the npm registry.\n# name version tarball-sha256 files\nuplot %s %s uPlot.iife.min.js uPlot.min.css uPlot.LICENSE\n' "$$took" "$$sum" > $(DASHBOARD_VENDOR)/VERSIONS; \
	echo "assets: vendored uplot $$took into dashboard/static/vendor"

.PHONY: clean
clean: ## Remove build outputs (keeps ./bin tools)
	rm -f $(BIN)/pgworker
