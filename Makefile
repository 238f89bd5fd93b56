# Every target explains itself: run `make help`.
GO          ?= go
TEST_FLAGS  ?= -race -count=1
BENCH_COUNT ?= 6
BENCH_DIR   ?= .bench
MODULES     := . examples benchmarks backends/dynamostore backends/mysqlstore contrib/awssqs contrib/idemotel contrib/sqloutbox cmd/idem monitoring
TOOL_MODS   := tools

SHELL       := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: demo
demo: ## Run the demo: in-memory store and GoChannel, no services needed
	cd examples && $(GO) run ./quickstart

# testenv runs a command with private servers: it installs what is
# missing, starts each server on a free port in a temporary directory,
# passes the addresses in REDIS_ADDR, TEST_DATABASE_URL, ... and removes
# everything when the command ends. A variable you set names a server of
# yours instead (docs/development.md).
TESTENV := bin/testenv

bin/testenv: tools/go.mod tools/go.sum $(wildcard tools/testenv/*.go)
	cd tools && GOWORK=off $(GO) build -o ../bin/testenv ./testenv

EXAMPLE ?= redis

.PHONY: example-redis
example-redis: bin/testenv ## Run the Redis Streams example against a private Redis (or yours: REDIS_ADDR)
	@$(TESTENV) -cc=false -services redis -- sh -c 'cd examples && exec $(GO) run ./redis'

.PHONY: example-kafka
example-kafka: bin/testenv ## Run the Kafka example: in-process Kafka (or KAFKA_BROKERS), leases in a private Redis (or REDIS_ADDR)
	@$(TESTENV) -cc=false -services redis -- sh -c 'cd examples && exec $(GO) run ./kafka'

.PHONY: example-outbox
example-outbox: bin/testenv ## Run the outbox example: charges, receipts and keys in one Postgres transaction, receipts forwarded to Redis Streams (private Postgres and Redis, or TEST_DATABASE_URL, REDIS_ADDR)
	@$(TESTENV) -cc=false -services redis,postgres -- sh -c 'cd examples && DATABASE_URL="$$TEST_DATABASE_URL" exec $(GO) run ./outbox'

.PHONY: example-http
example-http: bin/testenv ## Run the HTTP example: an order API behind the Idempotency-Key middleware, orders and OrderPlaced in one Postgres transaction, charged once from Redis Streams; retries, concurrent copies, a reused key and a killed API (private Postgres and Redis, or TEST_DATABASE_URL, REDIS_ADDR)
	@$(TESTENV) -cc=false -services redis,postgres -- sh -c 'cd examples && DATABASE_URL="$$TEST_DATABASE_URL" exec $(GO) run ./http'

.PHONY: example-sqs
example-sqs: bin/testenv ## Run the SQS example against a private goaws (or SQS_ENDPOINT) and a private Redis (or REDIS_ADDR)
	@$(TESTENV) -cc=false -services redis,sqs -- sh -c 'cd examples && exec $(GO) run ./sqs'

STORE ?= redis

# The examples run with docker compose: Compose v2.20 or later (the
# `docker compose` plugin; examples/sqs's file has an optional dependency,
# `required: false`). No engine runs in CI: examples/compose_test.go loads
# every file and checks these two recipes with `make -n`.
COMPOSE_FILE = examples/$(EXAMPLE)/docker-compose.yml

.PHONY: up
up: ## Run an example and its services with docker compose v2.20+; fails if its check fails (EXAMPLE=redis, sqs, outbox or http; STORE=redis, postgres or, for sqs, dynamodb)
	@test -f $(COMPOSE_FILE) || { echo "no $(COMPOSE_FILE): EXAMPLE is redis, sqs, outbox or http"; exit 2; }
	STORE=$(STORE) docker compose -f $(COMPOSE_FILE) $(if $(filter postgres,$(STORE)),--profile postgres) up --exit-code-from example

# Every profile ('*'), whatever STORE `make up` had: a service of a
# profile not named here would be left running, and the network it holds
# would make the next `make up` fail.
.PHONY: down
down: ## Stop and remove everything `make up` started for an example, whatever its STORE: containers of every profile, network, volumes (EXAMPLE=redis, sqs, outbox or http)
	@test -f $(COMPOSE_FILE) || { echo "no $(COMPOSE_FILE): EXAMPLE is redis, sqs, outbox or http"; exit 2; }
	docker compose -f $(COMPOSE_FILE) --profile '*' down --volumes --remove-orphans

# idem version of a build from a clone prints (devel) and the commit: the
# go command stamps no VCS information into a build in a workspace.
.PHONY: idem
idem: ## Build the idem operator command into bin/idem
	cd cmd/idem && $(GO) build -ldflags "-X main.vcsRevision=$$(git rev-parse HEAD) -X main.vcsModified=$$(test -z "$$(git status --porcelain)" && echo false || echo true)" -o ../../bin/idem .

# The modules' tests, longest first; TEST_JOBS of them run at once, each
# module's output printed whole when it ends.
TEST_MODULES := examples core backends/dynamostore backends/mysqlstore contrib/sqloutbox contrib/idemotel monitoring cmd/idem contrib/awssqs benchmarks tools
TEST_JOBS    ?= 3

.PHONY: test
test: bin/testenv ## Run every test with the race detector, against private servers it installs and starts (docs/development.md)
	@$(TESTENV) -- $(MAKE) --no-print-directory -k -j$(TEST_JOBS) -O $(addprefix test/,$(TEST_MODULES))

# Not .PHONY: make applies no pattern rule to a phony target. No file is
# named so.
test/core:
	$(GO) test $(TEST_FLAGS) ./...

test/tools:
	cd tools && GOWORK=off $(GO) test $(TEST_FLAGS) ./...

test/%:
	cd $* && $(GO) test $(TEST_FLAGS) ./...

.PHONY: test-stress
test-stress: bin/testenv ## Run the storm and fault tests 3 times while CPU hogs load every core, against private servers (HOGS, STRESS_RUNS)
	@$(TESTENV) -- env GO=$(GO) TEST_FLAGS="$(TEST_FLAGS)" .ci/stress

.PHONY: bench
bench: bench-core bench-redis bench-postgres bench-mysql bench-dynamo bench-record bench-wake bench-e2e bench-outbox bench-state bench-http ## Run every benchmark and print it against its baselines

# The benchmarks run against private servers, as the tests do, unless you
# name yours (TEST_DATABASE_URL, MYSQL_DSN, DYNAMODB_ENDPOINT, REDIS_ADDR).
BENCH_ENV = $(TESTENV) -cc=false -services

.PHONY: bench-postgres
bench-postgres: bin/testenv ## Benchmark the Postgres store against pgbench running its statements (private Postgres, or TEST_DATABASE_URL)
	@mkdir -p $(BENCH_DIR)
	@$(BENCH_ENV) postgres -- sh -c 'cd benchmarks && $(GO) run ./pgbench -url "$$TEST_DATABASE_URL"' | tee $(BENCH_DIR)/postgres.txt

.PHONY: bench-mysql
bench-mysql: bin/testenv ## Benchmark the MySQL store against its own statements run raw through the same driver (private MariaDB, or MYSQL_DSN)
	@mkdir -p $(BENCH_DIR)
	@$(BENCH_ENV) mariadb -- sh -c 'cd benchmarks && $(GO) run ./mysqlbench -dsn "$$MYSQL_DSN"' | tee $(BENCH_DIR)/mysql.txt

.PHONY: bench-dynamo
bench-dynamo: bin/testenv ## Benchmark the DynamoDB store against raw conditional PutItems (private dynalite, or DYNAMODB_ENDPOINT)
	@mkdir -p $(BENCH_DIR)
	@$(BENCH_ENV) dynamodb -- sh -c 'cd benchmarks && $(GO) run ./dynamobench -endpoint "$$DYNAMODB_ENDPOINT"' | tee $(BENCH_DIR)/dynamo.txt

.PHONY: bench-record
bench-record: bin/testenv ## The bytes one record takes in each store: Redis MEMORY USAGE, Postgres and MariaDB per row, DynamoDB's item size (private servers, or REDIS_ADDR, TEST_DATABASE_URL, MYSQL_DSN, DYNAMODB_ENDPOINT)
	@mkdir -p $(BENCH_DIR)
	@$(BENCH_ENV) redis,postgres,mariadb,dynamodb -- sh -c 'cd benchmarks && $(GO) run ./recordsize -redis "$$REDIS_ADDR" -pg "$$TEST_DATABASE_URL" -mysql "$$MYSQL_DSN" -dynamo "$$DYNAMODB_ENDPOINT"' | tee $(BENCH_DIR)/record.txt

.PHONY: bench-wake
bench-wake: bin/testenv ## Time from a holder's completion to its waiting duplicate's ack, polled and watched, on Redis and Postgres (private, or REDIS_ADDR, TEST_DATABASE_URL)
	@mkdir -p $(BENCH_DIR)
	@$(BENCH_ENV) redis,postgres -- sh -c 'cd benchmarks && $(GO) run ./wakebench -redis "$$REDIS_ADDR" -pg "$$TEST_DATABASE_URL"' | tee $(BENCH_DIR)/wake.txt

.PHONY: bench-outbox
bench-outbox: bin/testenv ## The transactional outbox against the plain path: throughput and commit-to-broker latency, polled and woken, Postgres and MariaDB (private Postgres, MariaDB and Redis, or TEST_DATABASE_URL, MYSQL_DSN, REDIS_ADDR)
	@mkdir -p $(BENCH_DIR)
	@$(BENCH_ENV) redis,postgres,mariadb -- sh -c 'cd benchmarks && $(GO) run ./outboxbench -url "$$TEST_DATABASE_URL" -mysql "$$MYSQL_DSN" -redis "$$REDIS_ADDR"' | tee $(BENCH_DIR)/outbox.txt

.PHONY: bench-state
bench-state: bin/testenv ## What one collection of the store gauges costs: a Count of 10k and 100k records on each store, its time and server work (private Redis, Postgres, MariaDB, dynalite, or REDIS_ADDR, TEST_DATABASE_URL, MYSQL_DSN, DYNAMODB_ENDPOINT)
	@mkdir -p $(BENCH_DIR)
	@$(BENCH_ENV) redis,postgres,mariadb,dynamodb -- sh -c 'cd benchmarks && $(GO) run ./statebench -redis "$$REDIS_ADDR" -pg "$$TEST_DATABASE_URL" -mysql "$$MYSQL_DSN" -dynamo "$$DYNAMODB_ENDPOINT"' | tee $(BENCH_DIR)/state.txt

.PHONY: bench-http
bench-http: bin/testenv ## The HTTP middleware's cost per request over loopback: the handler alone, httpidem on memstore and on Redis, and a hand-written SETNX middleware on the same Redis (private Redis, or REDIS_ADDR)
	@mkdir -p $(BENCH_DIR)
	@$(BENCH_ENV) redis -- sh -c 'cd benchmarks && $(GO) run ./httpbench -redis "$$REDIS_ADDR"' | tee $(BENCH_DIR)/http.txt

.PHONY: bench-redis
bench-redis: bin/testenv ## Benchmark the Redis store against redis-benchmark and redislock (private Redis, or REDIS_ADDR)
	@mkdir -p $(BENCH_DIR)
	@$(BENCH_ENV) redis -- sh -c 'cd benchmarks && $(GO) run ./redisbench -addr "$$REDIS_ADDR"' | tee $(BENCH_DIR)/redis.txt

# E2E_FLAGS are e2ebench's own: -n, -rounds, -consumers, -dup, -spread,
# -variants (go run ./e2ebench -h).
E2E_FLAGS ?=

.PHONY: bench-e2e
bench-e2e: bin/testenv ## A user's path on Redis Streams, no middleware, the Deduplicator and each store: msg/s and CPU per message (private Redis, Postgres, MariaDB, or REDIS_ADDR, TEST_DATABASE_URL, MYSQL_DSN; E2E_FLAGS)
	@mkdir -p $(BENCH_DIR)
	@$(BENCH_ENV) redis,postgres,mariadb -- sh -c 'cd benchmarks && $(GO) run ./e2ebench -redis "$$REDIS_ADDR" -pg "$$TEST_DATABASE_URL" -mysql "$$MYSQL_DSN" $(E2E_FLAGS)' 2>&1 | tee $(BENCH_DIR)/e2e.txt

.PHONY: bench-core
bench-core: bin/testenv ## Benchmark the middleware on the in-memory store against Watermill's Deduplicator, a store call's deadline context on each store (private Redis and Postgres, or REDIS_ADDR, TEST_DATABASE_URL), and the OpenTelemetry observer
	@mkdir -p $(BENCH_DIR)
	$(BENCH_ENV) redis,postgres -- sh -c '$(GO) test -run "^$$" -bench . -benchmem -count $(BENCH_COUNT) ./middleware/' | tee $(BENCH_DIR)/middleware.txt
	$(GO) test -run '^$$' -bench . -benchmem -count $(BENCH_COUNT) ./keyfunc/ | tee $(BENCH_DIR)/keyfunc.txt
	cd contrib/idemotel && $(GO) test -run '^$$' -bench . -benchmem -count $(BENCH_COUNT) . | tee $(abspath $(BENCH_DIR))/otel.txt
	@echo; echo "== middleware per message, against Watermill's Deduplicator (base) and no middleware"
	cd tools && GOWORK=off $(GO) tool benchstat -filter '-.name:StoreCallContext' -col '/mw@(deduplicator idempotency none)' $(abspath $(BENCH_DIR))/middleware.txt
	@echo; echo "== one store call under the middleware's deadline context (base) and context.WithTimeout"
	cd tools && GOWORK=off $(GO) tool benchstat -filter '.name:StoreCallContext' -col '/ctx@(deadlineCtx WithTimeout)' $(abspath $(BENCH_DIR))/middleware.txt
	@echo; echo "== the OpenTelemetry observer and instrumented store, against the plain middleware (base)"
	cd tools && GOWORK=off $(GO) tool benchstat -col '/mw@(idempotency otel otel+store)' $(abspath $(BENCH_DIR))/otel.txt
	@echo; echo "== key extraction"
	cd tools && GOWORK=off $(GO) tool benchstat $(abspath $(BENCH_DIR))/keyfunc.txt

# The release tool (tools/release) serves every module at the version from
# a module proxy of its own in a temporary directory; the version comes
# from CHANGELOG.md, never from git tags: docs/releasing.md.
.PHONY: release
release: ## Prepare release VERSION=vX.Y.Z: move CHANGELOG.md's [Unreleased] to it, set the docs' install lines, the siblings' requires and go.work to it, tidy against a local proxy, print the commit and tags
	@cd tools && GOWORK=off $(GO) build -o ../bin/release ./release
	@if [ -z "$(VERSION)" ]; then echo "usage: make release VERSION=vX.Y.Z; CHANGELOG.md names $$(bin/release -next)"; exit 2; fi
	GO=$(GO) bin/release -version $(VERSION)

.PHONY: tidy
tidy: ## go mod tidy every module, uncommitted changes included (go mod tidy itself cannot, in the workspace)
	cd tools && GOWORK=off $(GO) build -o ../bin/release ./release
	GO=$(GO) bin/release -tidy

.PHONY: release-check
release-check: ## Check HEAD as the next release, at the version CHANGELOG.md names (VERSION to choose another): tidy and vet (tests included) without the workspace, then go get and go install every module from outside the repository
	cd tools && GOWORK=off $(GO) build -o ../bin/release ./release
	GO=$(GO) bin/release -check $(if $(VERSION),-version $(VERSION))

# staticcheck at the version tools/go.mod pins, built once; its checks
# are chosen in staticcheck.conf.
STATICCHECK := bin/staticcheck

bin/staticcheck: tools/go.mod tools/go.sum
	cd tools && GOWORK=off $(GO) build -o ../bin/staticcheck honnef.co/go/tools/cmd/staticcheck

# Every package of every module of the workspace, for one staticcheck run.
LINT_PKGS := $(foreach m,$(MODULES),$(if $(filter .,$(m)),./...,./$(m)/...))

.PHONY: lint
lint: bin/staticcheck ## Check formatting, go vet and staticcheck in every module, and that no package imports one above its floor (tidiness without the workspace: make release-check)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@for m in $(MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done
	@$(STATICCHECK) $(LINT_PKGS)
	@# No module imports another module's internal packages: a published
	@# module must not break when a sibling's internals change. Direct
	@# imports only: a sibling's public package may use its own internals.
	@for m in $(MODULES); do \
	  (cd $$m && mod=$$(awk '/^module /{print $$2; exit}' go.mod) && \
	    $(GO) list -deps -test -f '{{.ImportPath}}|{{with .Module}}{{.Path}}{{end}}|{{join .Imports ","}}' ./... | \
	    awk -F'|' -v mod="$$mod" '{ sub(/ \[.*/, "", $$1); modof[$$1] = $$2; \
	        if ($$2 == mod) { n = split($$3, imps, ","); for (i = 1; i <= n; i++) { sub(/ \[.*/, "", imps[i]); imported[imps[i]] = 1 } } } \
	      END { for (p in imported) if (p ~ /\/internal(\/|$$)/ && modof[p] ~ /^github.com\/watermill-idempotency\// && modof[p] != mod) { print p " " modof[p]; bad = 1 } \
	        if (bad) { print "module " mod " imports the internal packages above, of another module"; exit 1 } }') || exit 1; \
	done
	@# No package imports one on a floor above its own: the stores, then
	@# keyfunc, then the middleware, then the rest (docs/development.md).
	@$(GO) test -count=1 ./internal/floors
	@for m in $(TOOL_MODS); do (cd $$m && GOWORK=off $(GO) vet ./... && GOWORK=off $(CURDIR)/$(STATICCHECK) ./... && GOWORK=off $(GO) mod tidy -diff) || exit 1; done
	@echo "lint ok"
