package idemotel_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// service returns the address of a server the tests use, from the
// environment variable name, and fails the test if it is not set: `make
// test` starts private servers and sets these. A test never falls back to
// a server on a default port, which may be one the user runs.
func service(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set. Run the tests with `make test`, which starts private servers and sets it, "+
			"or set it to a server the tests may write to", name)
	}
	return v
}

// unique returns a name unlikely to repeat, holding this run's id
// ($IDEM_TEST_RUN), by which `make test` finds the run's keys on a Redis
// the user shares.
func unique(prefix string) string {
	return fmt.Sprintf("%s%s-%d-%d:", prefix, os.Getenv("IDEM_TEST_RUN"), os.Getpid(), time.Now().UnixNano())
}

// freezer is a go-redis hook that, once on, holds every call until its
// context ends, as a server that stopped answering would.
type freezer struct{ on atomic.Bool }

func (f *freezer) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *freezer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if f.on.Load() {
			<-ctx.Done()
			cmd.SetErr(ctx.Err())
			return ctx.Err()
		}
		return next(ctx, cmd)
	}
}

func (f *freezer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if f.on.Load() {
			<-ctx.Done()
			for _, cmd := range cmds {
				cmd.SetErr(ctx.Err())
			}
			return ctx.Err()
		}
		return next(ctx, cmds)
	}
}
