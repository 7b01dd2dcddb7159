# pgworker — `make help` lists the targets.

GO        ?= go
BIN       := $(CURDIR)/bin
GOOSE_VERSION := v3.30.0
MINIO_VERSION := v0.0.0-20260212201848-7aac2a2c5b7c
STATICCHECK_VERSION := v0.8.2
TEST_FLAGS ?=
TESTENV   := $(GO) run ./internal/cmd/testenv --

export PATH := $(BIN):$(PATH)

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build bin/pgworker
	$(GO) build -o $(BIN)/pgworker ./cmd/pgworker

.PHONY: test
test: tools ## Run all tests with -race against throwaway PostgreSQL and MinIO servers
	$(TESTENV) $(GO) test -race -count=1 -timeout 15m $(TEST_FLAGS) ./...

.PHONY: test-short
test-short: ## Run the tests without the slow ones (-short)
	$(TESTENV) $(GO) test -race -count=1 -short $(TEST_FLAGS) ./...

.PHONY: bench
bench: ## Run the Go benchmarks
	$(TESTENV) $(GO) test -run '^$$' -bench . -benchmem ./...

.PHONY: lint
lint: ## gofmt, go vet and staticcheck
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt: the files above need formatting"; exit 1; }
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

.PHONY: schema
schema: ## Regenerate sql/schema.sql from migrations/
	./scripts/schema.sh

.PHONY: tools
tools: $(BIN)/goose $(BIN)/minio ## Install pinned goose and MinIO binaries into ./bin

$(BIN)/goose:
	GOBIN=$(BIN) $(GO) install github.com/pressly/goose/v3/cmd/goose@$(GOOSE_VERSION)

$(BIN)/minio:
	GOBIN=$(BIN) $(GO) install github.com/minio/minio@$(MINIO_VERSION)

.PHONY: clean
clean: ## Remove build outputs (keeps ./bin tools)
	rm -f $(BIN)/pgworker
