package main

import (
	"fmt"
	"io"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/watermill-idempotency/idempotency/benchmarks/internal/load"
)

// printTable prints the medians over the rounds as a Markdown table, and
// what the runs' checks found.
func printTable(out io.Writer, e *env, versions []string, results []result) {
	cfg := e.cfg
	n := cfg.messages
	distinct := n - duplicateCount(n, cfg.duplicates)
	base := results[0]
	fmt.Fprintf(out, "End to end on Redis Streams: %s messages per run, %s distinct keys (%.0f%% duplicates, each before the original %d keys after its own), "+
		"%d router handlers in one consumer group, one process; median of %d rounds, the variants' order rotating each round\n",
		thousands(float64(n)), thousands(float64(distinct)), 100*cfg.duplicates, cfg.spread, cfg.consumers, cfg.rounds)
	fmt.Fprintf(out, "%s, GOMAXPROCS %d, %s\n", runtime.Version(), runtime.GOMAXPROCS(0), strings.Join(versions, ", "))
	fmt.Fprintf(out, "CPU per published message: client = this process (getrusage), Redis = INFO cpu, store server = the Postgres or MariaDB processes (/proc); "+
		"ratios are medians of each round's ratio to %s in the same round (lowest–highest)\n\n", base.variant.name)

	w := tabwriter.NewWriter(out, 0, 0, 1, ' ', 0)
	fmt.Fprintf(w, "| variant\t| msg/s\t| × %s\t| client µs/msg\t| Redis µs/msg\t| store server µs/msg\t| total core-µs/msg\t| × %s\t|\n", base.variant.name, base.variant.name)
	fmt.Fprintln(w, "|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|")
	for _, r := range results {
		rate := func(m measurement) float64 { return float64(n) / m.elapsed.Seconds() }
		total := func(m measurement) float64 { return perMsg(m.client+m.redis+m.store, n) }
		store := "–"
		if r.variant.server != noServer {
			store = "n/a"
			if r.runs[0].storeKnown {
				store = fmt.Sprintf("%.1f", median(r.runs, func(m measurement) float64 { return perMsg(m.store, n) }))
			}
		}
		fmt.Fprintf(w, "| %s\t| %s\t| %s\t| %.1f\t| %.1f\t| %s\t| %.1f\t| %s\t|\n",
			r.variant.name,
			thousands(median(r.runs, rate)),
			ratio(r.runs, base.runs, rate),
			median(r.runs, func(m measurement) float64 { return perMsg(m.client, n) }),
			median(r.runs, func(m measurement) float64 { return perMsg(m.redis, n) }),
			store,
			median(r.runs, total),
			ratio(r.runs, base.runs, total))
	}
	_ = w.Flush()

	fmt.Fprintln(out)
	for _, r := range results {
		var verdict string
		switch {
		case r.variant.once:
			verdict = "every key ran the handler once in every round"
		case firstErr(r.runs, func(m measurement) error { return m.copies }) == nil:
			verdict = "every copy ran the handler"
		case firstErr(r.runs, func(m measurement) error { return m.once }) == nil:
			verdict = "every key ran the handler once"
		default:
			verdict = "not once per key: " + firstErr(r.runs, func(m measurement) error { return m.once }).Error()
		}
		med := func(f func(measurement) int64) string {
			return thousands(median(r.runs, func(m measurement) float64 { return float64(f(m)) }))
		}
		fmt.Fprintf(out, "%s: %s; per run, median: ", r.variant.name, verdict)
		if r.variant.once && !r.variant.peer {
			fmt.Fprintf(out, "%s deliveries dropped as duplicates, %s waited for the holder of their key, ",
				med(func(m measurement) int64 { return m.duplicates }), med(func(m measurement) int64 { return m.waited }))
		}
		fmt.Fprintf(out, "%s nacked\n", med(func(m measurement) int64 { return m.nacks }))
	}
	// What Redis ran, per message. Execution leaves out reading requests
	// and writing replies (system calls), which the Redis column counts.
	fmt.Fprintln(out, "\nRedis commands per message, median: calls (µs executing them, INFO commandstats; "+
		"commands a script runs count on their own as well as within EVALSHA's time)")
	for _, r := range results {
		names := map[string]bool{}
		for _, m := range r.runs {
			for name := range m.commands {
				names[name] = true
			}
		}
		var parts []string
		for _, name := range slices.Sorted(maps.Keys(names)) {
			calls := median(r.runs, func(m measurement) float64 { return float64(m.commands[name].calls) / float64(n) })
			if calls >= 0.01 {
				us := median(r.runs, func(m measurement) float64 { return perMsg(m.commands[name].exec, n) })
				parts = append(parts, fmt.Sprintf("%s %.2f (%.1f)", name, calls, us))
			}
		}
		fmt.Fprintf(out, "%s: %s\n", r.variant.name, strings.Join(parts, ", "))
	}
	fmt.Fprintln(out)

	for _, s := range []server{postgresServer, mariadbServer} {
		if err := e.noMeter[s]; err != nil {
			fmt.Fprintln(out, err)
		}
	}
}

// median is the median of f over the runs.
func median(runs []measurement, f func(measurement) float64) float64 {
	v := make([]float64, len(runs))
	for i, m := range runs {
		v[i] = f(m)
	}
	return load.Median(v)
}

// ratio is the median over the rounds of f of a round's run over f of
// the base's run in the same round, with the lowest and highest of them
// when there are several rounds.
func ratio(runs, base []measurement, f func(measurement) float64) string {
	v := make([]float64, len(runs))
	for i := range runs {
		v[i] = f(runs[i]) / f(base[i])
	}
	s := fmt.Sprintf("%.2f×", load.Median(v))
	if len(v) > 1 {
		s += fmt.Sprintf(" (%.2f–%.2f)", slices.Min(v), slices.Max(v))
	}
	return s
}

func firstErr(runs []measurement, f func(measurement) error) error {
	for _, m := range runs {
		if err := f(m); err != nil {
			return err
		}
	}
	return nil
}

// thousands formats v rounded, with commas between thousands.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(v+0.5), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
