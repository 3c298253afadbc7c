# Every module of the workspace (go.work) is covered by the `work` package pattern.
GO      ?= go
BENCH   ?= .
COUNT   ?= 6
# Linters are pinned and run through go run, so make lint checks the same on every machine.
GOLANGCI_LINT ?= $(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0
STATICCHECK   ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
MODULES       := $(shell $(GO) work edit -json | sed -n 's/.*"DiskPath": "\(.*\)".*/\1/p')

.PHONY: help build test test-short bench bench-peers lint demo torture
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-11s %s\n", $$1, $$2}'

build: ## build the fenced command into ./bin/fenced
	$(GO) build -o bin/fenced ./cmd/fenced

test: ## run every test of every module with -race (servers: see README)
	$(GO) test -race -count=1 -timeout 30m work

test-short: ## the tests without the race detector, for a quick look
	$(GO) test -count=1 work

bench: ## benchmarks beside their raw baselines; compare with: benchstat -col /impl bench.txt
	$(GO) test -run '^$$' -bench '$(BENCH)' -count $(COUNT) -timeout 60m work | tee bench.txt

bench-peers: ## fenced beside PostgreSQL advisory locks, redsync, redislock and etcd's Mutex, into bench-peers.txt
	cd bench/peers && $(GO) run . $(PEERS_FLAGS) | tee $(CURDIR)/bench-peers.txt

lint: ## gofmt, go vet, staticcheck and golangci-lint (pinned versions) on every module
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet work
	$(STATICCHECK) work
	@set -e; for m in $(MODULES); do echo "golangci-lint $$m"; (cd $$m && $(GOLANGCI_LINT) run --config $(CURDIR)/.golangci.yml ./...); done

demo: ## the failure and the fence, with real processes
	$(GO) run ./cmd/fenced demo

TORTURE_TIME ?= 7m
torture: ## fenced torture on every backend for TORTURE_TIME with every fault that applies and the controls, one line per backend; then the checker on 10k..1M operations
	FENCED_TORTURE_TIME=$(TORTURE_TIME) $(GO) test -tags torture -count=1 -timeout 3h -v -run TestTortureEveryBackend ./cmd/fenced/cli | grep --line-buffered -E '^(torture|--- FAIL|FAIL|ok)'
	FENCED_TORTURE_SCALE=1000000 FENCED_TORTURE_SCALE_REPEAT=3 $(GO) test -count=1 -timeout 1h -run TestCheckerScale -v ./cmd/fenced/torture | grep -E '^(checker|--- FAIL|FAIL|ok)'
