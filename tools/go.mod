module github.com/watermill-idempotency/idempotency/tools

go 1.25.0

tool golang.org/x/perf/cmd/benchstat

require (
	github.com/aclements/go-moremath v0.0.0-20210112150236-f10218a38794 // indirect
	golang.org/x/perf v0.0.0-20250813145418-2f7363a06fe1 // indirect
)
