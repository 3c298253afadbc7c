# Every module of the workspace (go.work) is covered by the `work` package pattern.
GO      ?= go
BENCH   ?= .
COUNT   ?= 6

.PHONY: help build test test-short bench lint demo
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-11s %s\n", $$1, $$2}'

build: ## build the fenced command into ./bin/fenced
	$(GO) build -o bin/fenced ./cmd/fenced

test: ## run every test of every module with -race (servers: see README)
	$(GO) test -race -count=1 -timeout 20m work

test-short: ## the tests without the race detector, for a quick look
	$(GO) test -count=1 work

bench: ## benchmarks beside their raw baselines; compare with: benchstat -col /impl bench.txt
	$(GO) test -run '^$$' -bench '$(BENCH)' -count $(COUNT) -timeout 60m work | tee bench.txt

lint: ## gofmt, go vet, and golangci-lint when it is installed
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet work
	@if command -v golangci-lint >/dev/null; then golangci-lint run ./...; else echo "golangci-lint not installed; skipped"; fi

demo: ## the failure and the fence, with real processes
	$(GO) run ./cmd/fenced demo
