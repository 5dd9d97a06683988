# txhook's build, test and demo commands. Every target works on a fresh
# machine with Go and the PostgreSQL server binaries installed; see README.md.

GO       ?= go
SQLC     := $(GO) tool -modfile=tools/go.mod sqlc
STATICCHECK := $(GO) tool -modfile=tools/go.mod staticcheck
export GOTOOLCHAIN := local

# How long make fuzz runs each fuzz target, and how long it may spend
# minimizing each new input (the default minute stalls short runs).
FUZZTIME ?= 30s
FUZZMINIMIZETIME ?= 2s

# Modules with their own go.mod (the library first).
MODULES := . tests otelhook inbox natsconsumer amqpconsumer examples/quickstart examples/github-pushes examples/stripe-orders

.PHONY: all test check fmt-check vet generate sqlc-diff staticcheck unit demo chaos bench bench-scale fuzz screenshots

# step prints what make test is doing, with the time, between its steps.
step = @printf '\n==> %s  %s\n' "$$(date +%H:%M:%S)" $(1)

all: test

## test: everything CI runs: formatting, vet, staticcheck, generated code, race tests.
test: fmt-check vet staticcheck sqlc-diff unit

fmt-check:
	$(call step,"gofmt: every Go file formatted")
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(call step,"go vet in every module: $(MODULES)")
	@for m in $(MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done

staticcheck:
	$(call step,"staticcheck in every module (the first run builds it)")
	@for m in $(MODULES); do (cd $$m && $(GO) tool -modfile=$(CURDIR)/tools/go.mod staticcheck ./...) || exit 1; done

sqlc-diff:
	$(call step,"sqlc diff: the generated code in db/ and the examples is current (the first run builds sqlc)")
	@$(SQLC) diff

generate:
	$(SQLC) generate

unit:
	@for m in $(MODULES); do \
		printf '\n==> %s  %s\n' "$$(date +%H:%M:%S)" "go test -race ./... in module $$m (database tests on a throwaway PostgreSQL unless TEST_DATABASE_URL is set)"; \
		(cd $$m && $(GO) test -race -count=1 ./...) || exit 1; \
	done
	$(call step,"all checks passed")

## demo: the exactly-once story: a duplicate, a crash and its retry, the naive dedupe losing an event;
## then GitHub (never retries) in inbox mode: a push failing once and a process killed mid-job, each applied once.
demo:
	$(GO) run ./cmd/demo

## chaos: a provider that will not give up against a server that keeps dying (5,000 events, 60 kills);
## then the same against three receiver processes on one database, sent deliveries round robin
## (3,000 events, 36 kills, each on a receiver drawn at random);
## then GitHub, which never retries: 1,000 pushes sent once, failures recovered by the redelivery sweeper;
## then GitHub against inbox mode: 2,000 pushes sent once, 24 kills, every push answered 2xx applied once;
## then RabbitMQ: 5,000 events published with ids to the example's queue, 24 kills, the broker (a node of
## the run's own) and PostgreSQL restarted once each: every event applied once, no message left;
## then NATS JetStream: 5,000 events published (some again), the consumer SIGKILLed 24 times, nats-server
## and PostgreSQL restarted once.
chaos:
	cd tests && $(GO) run ./chaos
	cd tests && $(GO) run ./chaos -receivers 3 -events 3000 -kills 36
	cd tests && $(GO) run ./chaos -github
	cd tests && $(GO) run ./chaos -inbox
	cd tests && $(GO) run ./chaos -amqp
	cd tests && $(GO) run ./chaos -nats

## bench: side-by-side benchmarks against the database's own limit, written to BENCHMARKS.md
## (the example over HTTP as one process and as three on one database, among the rows).
bench:
	cd tests && $(GO) run ./bench -out ../BENCHMARKS.md -root ..

## bench-scale: the library row against events tables of 0, 10 M and 50 M rows (generated once into a
## cluster kept between runs, under /var/tmp or TXHOOK_SCALE_DIR; or on DATABASE_URL's server), with and
## without a pruner running; written into BENCHMARKS.md's scale section. The first run fills the tables.
bench-scale:
	cd tests && $(GO) run ./bench -scale -out ../BENCHMARKS.md -root ..

## fuzz: every fuzz target of every module, for FUZZTIME each (default 30s).
fuzz:
	@set -e; for m in $(MODULES); do \
	  for dir in $$(cd $$m && $(GO) list -f '{{.Dir}}' ./...); do \
	    for t in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$dir/*_test.go 2>/dev/null | sed 's/^func //'); do \
	      echo "== $$t ($${dir#$(CURDIR)/}), $(FUZZTIME)"; \
	      (cd $$dir && $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) .); \
	    done; \
	  done; \
	done

## screenshots: the operator console's pages, from its browser tests, written to docs/screenshots/.
screenshots:
	cd tests && TXHOOK_SCREENSHOTS=$(CURDIR)/docs/screenshots $(GO) test -count=1 -run 'TestPages|TestReplayAppliesOnce|TestReadOnlyConsole' ./console
