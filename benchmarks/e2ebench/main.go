// Command e2ebench measures a user's whole path on Redis Streams: messages
// published to a stream, some of them twice (the same message UUID again,
// as a producer's retry sends it), consumed in one process by four router
// handlers in one consumer group, each a redisstream subscriber of its own,
// with a trivial handler. It runs the same stream through each variant:
//
//	none            no middleware: every copy runs the handler
//	deduplicator    Watermill's middleware.Deduplicator keyed by message UUID,
//	                its default in-memory repository
//	memstore        this middleware on the in-memory store
//	redis-setnx     a hand-written lease on Redis: SET NX PX GET before the
//	                handler, SET PX after (peers.go)
//	redis-cas       the same with an owner check: the claim's own token
//	                set, and a script that marks the key done only while
//	                it holds that token (peers.go)
//	redisstore      this middleware on Redis, the server of the stream
//	redisstore-off  the same with Coalescing: CoalesceOff
//	redisstore-cache
//	                redisstore with the middleware's completed-key cache
//	pg-insert       a hand-written lease on Postgres: INSERT ON CONFLICT DO
//	                NOTHING before the handler, UPDATE after (peers.go)
//	pg-cas          the same with an owner check: the claim's own token,
//	                which the UPDATE must find, and an index on the
//	                claims' expiry, for their cleanup (peers.go)
//	pgstore         this middleware on Postgres
//	pgstore-cache   the same with the completed-key cache
//	mysql-insert    a hand-written lease on MariaDB or MySQL: INSERT IGNORE
//	                before the handler, UPDATE after, prepared (peers.go)
//	mysql-cas       the same with an owner check and an index on the
//	                claims' expiry, as pg-cas (peers.go)
//	mysqlstore      this middleware on MariaDB or MySQL
//	mysqlstore-cache
//	                the same with the completed-key cache
//
// and prints for each the messages per second and the CPU each message
// cost: the benchmark process's own (getrusage), and the servers' over the
// same window (Redis: INFO cpu; Postgres and MariaDB: utime and stime in
// /proc of the server's processes, found by asking the server), with the
// ratios to the first variant (none). The variants run interleaved over
// several rounds, their order rotating each round, and the table gives
// medians. Each round publishes a fresh stream and gives each store a
// fresh keyspace or table.
//
// Every variant with this middleware must run the handler exactly once
// per distinct key: the benchmark counts the handler's runs per key and
// exits non-zero if a key ran twice or not at all.
//
//	go run ./e2ebench -redis 127.0.0.1:6379 -pg postgres://postgres@127.0.0.1:5432/test -mysql 'root@tcp(127.0.0.1:3306)/test'
//
// `make bench-e2e` runs it against private servers (docs/benchmarks.md).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"time"
)

func main() {
	cfg := defaultConfig()
	flag.StringVar(&cfg.redisAddr, "redis", "127.0.0.1:6379", "Redis address: the stream's server, and redisstore's")
	flag.StringVar(&cfg.pgURL, "pg", "", "Postgres URL, for pgstore")
	flag.StringVar(&cfg.mysqlDSN, "mysql", "", "MariaDB or MySQL DSN (go-sql-driver), for mysqlstore")
	flag.IntVar(&cfg.pgInFlight, "pg-inflight", 0, "pgstore's Options.InFlight: its round trips out at once (0: its default, a quarter of its pool, at most GOMAXPROCS)")
	flag.IntVar(&cfg.messages, "n", cfg.messages, "messages published per run, duplicates included")
	flag.Float64Var(&cfg.duplicates, "dup", cfg.duplicates, "fraction of the messages that repeat an earlier message's UUID")
	flag.IntVar(&cfg.spread, "spread", cfg.spread, "each duplicate is published after its original and before the original this many keys later")
	flag.IntVar(&cfg.consumers, "consumers", cfg.consumers, "router handlers, one redisstream subscriber each, in one consumer group")
	flag.IntVar(&cfg.rounds, "rounds", cfg.rounds, "rounds; each runs every variant once, in an order that rotates")
	variants := flag.String("variants", strings.Join(cfg.variants, ","), "variants to run, comma-separated; the first is the base of the ratios")
	flag.DurationVar(&cfg.stall, "stall", cfg.stall, "give up on a run when no message has been acked for this long")
	cpuprofile := flag.String("cpuprofile", "", "write the process's CPU profile over all runs to this file")
	flag.Parse()
	cfg.variants = strings.Split(*variants, ",")
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2ebench:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "e2ebench:", err)
			os.Exit(1)
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "e2ebench:", err)
		stop()
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// config is one benchmark run's settings.
type config struct {
	redisAddr, pgURL, mysqlDSN string
	// pgInFlight is pgstore's Options.InFlight.
	pgInFlight int

	messages   int
	duplicates float64
	spread     int
	consumers  int
	rounds     int
	variants   []string
	stall      time.Duration
	// runID is part of every name the benchmark creates on a server;
	// empty: $IDEM_TEST_RUN, or the time.
	runID string
}

func defaultConfig() config {
	return config{
		messages:   30000,
		duplicates: 0.2,
		spread:     1000,
		consumers:  4,
		rounds:     3,
		variants:   variantNames(),
		stall:      30 * time.Second,
	}
}

func (c config) validate() error {
	switch {
	case c.messages < 1:
		return fmt.Errorf("-n %d: at least one message", c.messages)
	case c.duplicates < 0 || c.duplicates >= 1:
		return fmt.Errorf("-dup %v: a fraction in [0, 1)", c.duplicates)
	case c.spread < 1:
		return fmt.Errorf("-spread %d: at least 1", c.spread)
	case c.consumers < 1:
		return fmt.Errorf("-consumers %d: at least 1", c.consumers)
	case c.rounds < 1:
		return fmt.Errorf("-rounds %d: at least 1", c.rounds)
	case c.pgInFlight < 0:
		return fmt.Errorf("-pg-inflight %d: not negative", c.pgInFlight)
	case len(c.variants) == 0:
		return fmt.Errorf("no variants")
	}
	seen := map[string]bool{}
	for _, name := range c.variants {
		if _, ok := lookupVariant(name); !ok {
			return fmt.Errorf("-variants: %q is none of %s", name, strings.Join(variantNames(), ", "))
		}
		if seen[name] {
			return fmt.Errorf("-variants: %q twice", name)
		}
		seen[name] = true
	}
	return nil
}
