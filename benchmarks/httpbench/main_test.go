package main

import (
	"os"
	"testing"
)

// TestBenchmark runs every variant, small, against the Redis `make test`
// starts: every answer is checked (201, replayed in the second phase), so
// that the benchmark keeps measuring what it says.
func TestBenchmark(t *testing.T) {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		t.Fatal("REDIS_ADDR is not set: run the tests with bin/testenv (docs/development.md)")
	}
	if err := run(addr, 200, 4, 1); err != nil {
		t.Fatal(err)
	}
}
