# Every target explains itself: run `make help`.
GO          ?= go
TEST_FLAGS  ?= -race -count=1
BENCH_COUNT ?= 6
BENCH_DIR   ?= .bench
MODULES     := . examples benchmarks backends/dynamostore backends/mysqlstore contrib/awssqs contrib/otel cmd/idem
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

DYNALITE_VERSION := 4.0.0

bin/dynalite: ## Install dynalite (DynamoDB on LevelDB, for Node.js) from npm, pinned, into .cache/dynalite
	npm install --no-audit --no-fund --loglevel=error --prefix .cache/dynalite dynalite@$(DYNALITE_VERSION)
	@mkdir -p bin
	printf '#!/bin/sh\nexec node "%s/.cache/dynalite/node_modules/dynalite/cli.js" "$$@"\n' "$(CURDIR)" > bin/dynalite
	chmod +x bin/dynalite

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
up: ## Run an example and its services with docker compose; fails if its check fails (EXAMPLE=redis or sqs, STORE=redis, postgres or, for sqs, dynamodb)
	STORE=$(STORE) docker compose -f examples/$(EXAMPLE)/docker-compose.yml $(if $(filter postgres,$(STORE)),--profile postgres) up --exit-code-from example

.PHONY: down
down: ## Stop and remove an example's docker compose services (EXAMPLE=redis or sqs)
	docker compose -f examples/$(EXAMPLE)/docker-compose.yml down -v

.PHONY: idem
idem: ## Build the idem operator command into bin/idem
	cd cmd/idem && $(GO) build -o ../../bin/idem .

# The modules' tests, longest first; TEST_JOBS of them run at once, each
# module's output printed whole when it ends.
TEST_MODULES := examples core backends/dynamostore backends/mysqlstore contrib/otel cmd/idem contrib/awssqs
TEST_JOBS    ?= 3

.PHONY: test
test: bin/goaws bin/dynalite ## Run every test with the race detector (needs Redis, Postgres, MariaDB, RabbitMQ, NATS and Node.js: see .ci/run)
	@$(MAKE) --no-print-directory -k -j$(TEST_JOBS) -O $(addprefix test/,$(TEST_MODULES))

# Not .PHONY: make applies no pattern rule to a phony target. No file is
# named so.
test/core:
	$(GO) test $(TEST_FLAGS) ./...

test/%:
	cd $* && $(GO) test $(TEST_FLAGS) ./...

.PHONY: test-stress
test-stress: bin/goaws bin/dynalite ## Run the storm and fault tests 3 times while CPU hogs load every core (HOGS, STRESS_RUNS)
	GO=$(GO) TEST_FLAGS="$(TEST_FLAGS)" .ci/stress

.PHONY: bench
bench: bench-core bench-redis bench-postgres bench-mysql bench-dynamo bench-wake ## Run every benchmark and print it against its baselines

.PHONY: bench-postgres
bench-postgres: ## Benchmark the Postgres store against pgbench running its statements (TEST_DATABASE_URL)
	@mkdir -p $(BENCH_DIR)
	cd benchmarks && $(GO) run ./pgbench -url $${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable} | tee ../$(BENCH_DIR)/postgres.txt

.PHONY: bench-mysql
bench-mysql: ## Benchmark the MySQL store against its own statements run raw through the same driver (MYSQL_DSN)
	@mkdir -p $(BENCH_DIR)
	cd benchmarks && $(GO) run ./mysqlbench -dsn "$${MYSQL_DSN:-root@tcp(127.0.0.1:3306)/test}" | tee ../$(BENCH_DIR)/mysql.txt

DYNALITE_PORT ?= 4567

.PHONY: bench-dynamo
bench-dynamo: bin/dynalite ## Benchmark the DynamoDB store against raw conditional PutItems, on a local dynalite (started and stopped here)
	@mkdir -p $(BENCH_DIR)
	@bin/dynalite --host 127.0.0.1 --port $(DYNALITE_PORT) --createTableMs 0 > /dev/null 2>&1 & pid=$$!; \
	trap 'kill $$pid 2>/dev/null' EXIT; sleep 1; \
	cd benchmarks && $(GO) run ./dynamobench -endpoint http://127.0.0.1:$(DYNALITE_PORT) | tee ../$(BENCH_DIR)/dynamo.txt

.PHONY: bench-wake
bench-wake: ## Time from a holder's completion to its waiting duplicate's ack, polled and watched, on Redis and Postgres (REDIS_ADDR, TEST_DATABASE_URL)
	@mkdir -p $(BENCH_DIR)
	cd benchmarks && $(GO) run ./wakebench -redis $${REDIS_ADDR:-127.0.0.1:6379} -pg $${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable} | tee ../$(BENCH_DIR)/wake.txt

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
