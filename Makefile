# Every target explains itself: run `make help`.
GO          ?= go
TEST_FLAGS  ?= -race -count=1
BENCH_COUNT ?= 6
BENCH_DIR   ?= .bench
MODULES     := . examples benchmarks contrib/awssqs contrib/otel cmd/idem
TOOL_MODS   := tools

SHELL       := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: demo
demo: ## Run the demo: in-memory store and GoChannel, no services needed
	cd examples && $(GO) run ./quickstart

EXAMPLE ?= redis

.PHONY: example-redis
example-redis: ## Run the Redis Streams example against local Redis (REDIS_ADDR)
	cd examples && $(GO) run ./redis

.PHONY: example-kafka
example-kafka: ## Run the Kafka example: in-process Kafka (or KAFKA_BROKERS), leases in local Redis (REDIS_ADDR)
	cd examples && $(GO) run ./kafka

GOAWS_PORT ?= 4100

bin/goaws: tools/go.mod tools/go.sum ## Build the goaws SQS emulator from its pinned version (tools/go.mod)
	cd tools && $(GO) build -o ../bin/goaws github.com/Admiral-Piett/goaws/app/cmd

.PHONY: example-sqs
example-sqs: bin/goaws ## Run the SQS example against a local goaws (started and stopped here) and local Redis
	@dir=$$(mktemp -d); \
	printf 'Local:\n  Host: 127.0.0.1\n  Port: $(GOAWS_PORT)\n  Region: us-east-1\n  AccountId: "000000000000"\n  LogToFile: false\n  EnableDuplicates: false\n  QueueAttributeDefaults:\n    VisibilityTimeout: 30\n  Queues: []\n  Topics: []\n' > $$dir/goaws.yaml; \
	(cd $$dir && exec $(CURDIR)/bin/goaws -config $$dir/goaws.yaml > $$dir/goaws.log 2>&1) & pid=$$!; \
	trap 'kill $$pid 2>/dev/null; rm -rf $$dir' EXIT; sleep 1; \
	cd examples && SQS_ENDPOINT=http://127.0.0.1:$(GOAWS_PORT) $(GO) run ./sqs

STORE ?= redis

.PHONY: up
up: ## Run an example and its services with docker compose; fails if its check fails (EXAMPLE=redis or sqs, STORE=redis or postgres)
	STORE=$(STORE) docker compose -f examples/$(EXAMPLE)/docker-compose.yml $(if $(filter postgres,$(STORE)),--profile postgres) up --exit-code-from example

.PHONY: down
down: ## Stop and remove an example's docker compose services (EXAMPLE=redis or sqs)
	docker compose -f examples/$(EXAMPLE)/docker-compose.yml down -v

.PHONY: idem
idem: ## Build the idem operator command into bin/idem
	cd cmd/idem && $(GO) build -o ../../bin/idem .

.PHONY: test
test: bin/goaws ## Run every test with the race detector (needs Redis and Postgres: see .ci/run)
	$(GO) test $(TEST_FLAGS) ./...
	cd examples && $(GO) test $(TEST_FLAGS) ./...
	cd contrib/awssqs && $(GO) test $(TEST_FLAGS) ./...
	cd contrib/otel && $(GO) test $(TEST_FLAGS) ./...
	cd cmd/idem && $(GO) test $(TEST_FLAGS) ./...

.PHONY: test-stress
test-stress: bin/goaws ## Run the storm and fault tests 3 times while CPU hogs load every core (HOGS, STRESS_RUNS)
	GO=$(GO) TEST_FLAGS="$(TEST_FLAGS)" .ci/stress

.PHONY: bench
bench: bench-core bench-redis bench-postgres ## Run every benchmark and print it against its baselines

.PHONY: bench-postgres
bench-postgres: ## Benchmark the Postgres store against pgbench running its statements (TEST_DATABASE_URL)
	@mkdir -p $(BENCH_DIR)
	cd benchmarks && $(GO) run ./pgbench -url $${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable} | tee ../$(BENCH_DIR)/postgres.txt

.PHONY: bench-redis
bench-redis: ## Benchmark the Redis store against redis-benchmark and redislock (REDIS_ADDR)
	@mkdir -p $(BENCH_DIR)
	cd benchmarks && $(GO) run ./redisbench -addr $${REDIS_ADDR:-127.0.0.1:6379} | tee ../$(BENCH_DIR)/redis.txt

.PHONY: bench-core
bench-core: ## Benchmark the middleware on the in-memory store against Watermill's Deduplicator, and the OpenTelemetry observer against it
	@mkdir -p $(BENCH_DIR)
	$(GO) test -run '^$$' -bench . -benchmem -count $(BENCH_COUNT) ./middleware/ | tee $(BENCH_DIR)/middleware.txt
	$(GO) test -run '^$$' -bench . -benchmem -count $(BENCH_COUNT) ./keyfunc/ | tee $(BENCH_DIR)/keyfunc.txt
	cd contrib/otel && $(GO) test -run '^$$' -bench . -benchmem -count $(BENCH_COUNT) . | tee ../../$(BENCH_DIR)/otel.txt
	@echo; echo "== middleware per message, against Watermill's Deduplicator (base) and no middleware"
	cd tools && $(GO) tool benchstat -col '/mw@(deduplicator idempotency none)' ../$(BENCH_DIR)/middleware.txt
	@echo; echo "== the OpenTelemetry observer and instrumented store, against the plain middleware (base)"
	cd tools && $(GO) tool benchstat -col '/mw@(idempotency otel otel+store)' ../$(BENCH_DIR)/otel.txt
	@echo; echo "== key extraction"
	cd tools && $(GO) tool benchstat ../$(BENCH_DIR)/keyfunc.txt

.PHONY: lint
lint: ## Check formatting, go vet and that go.mod files are tidy
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@for m in $(MODULES); do (cd $$m && $(GO) vet ./... && $(GO) mod tidy -diff) || exit 1; done
	@for m in $(TOOL_MODS); do (cd $$m && $(GO) mod tidy -diff) || exit 1; done
	@echo "lint ok"
