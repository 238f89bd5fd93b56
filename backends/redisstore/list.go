package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

// scanBatch is the COUNT hint of each SCAN, and the most keys sent in one
// pipeline.
const scanBatch = 1000

// List implements [backends.Lister]. Redis keeps no order of keys, so
// every page scans the whole keyspace (every master of a Cluster) for the
// namespace's keys and sorts those after the cursor: a page costs a SCAN
// of every key on the server, plus one pipelined look at the records it
// returns. It is meant for operators, not for a hot path.
func (s *Store) List(ctx context.Context, req backends.ListRequest) (backends.ListPage, error) {
	if err := storekit.ValidateList(req); err != nil {
		return backends.ListPage{}, err
	}
	keys, err := s.scan(ctx, storekit.ListPrefix(req.Namespace))
	if err != nil {
		return backends.ListPage{}, err
	}
	return storekit.Page(ctx, req, keys, scanBatch, s.inspectMany)
}

// Count implements [backends.Lister], scanning as List does. It inspects
// the records with inspect.lua's 'header', which reads no record's
// output.
func (s *Store) Count(ctx context.Context, namespace string) (backends.Counts, error) {
	keys, err := s.scan(ctx, storekit.ListPrefix(namespace))
	if err != nil {
		return backends.Counts{}, err
	}
	slices.Sort(keys)
	keys = slices.Compact(keys) // SCAN may return a key twice
	var c backends.Counts
	for batch := range slices.Chunk(keys, scanBatch) {
		cmds, err := s.evalEach(ctx, inspectScript, batch, "header")
		if err != nil {
			return backends.Counts{}, opError(ctx, "count", err)
		}
		for i, cmd := range cmds {
			vals, err := cmd.Slice()
			if err != nil {
				continue // gone since the scan
			}
			if rec, err := parseRecord(batch[i], vals, true); err == nil { // else not a record
				storekit.AddCount(&c, rec.State, rec.AcquiredAt)
			}
		}
	}
	return c, nil
}

// inspectMany inspects keys in one pipeline and returns the records that
// still exist, in the order of keys.
func (s *Store) inspectMany(ctx context.Context, keys []string) ([]backends.Record, error) {
	cmds, err := s.evalEach(ctx, inspectScript, keys)
	if err != nil {
		return nil, opError(ctx, "list", err)
	}
	recs := make([]backends.Record, 0, len(keys))
	for i, cmd := range cmds {
		vals, err := cmd.Slice()
		if errors.Is(err, redis.Nil) {
			continue // gone since the scan
		}
		if err != nil {
			return nil, opError(ctx, "list", err)
		}
		rec, err := parseRecord(keys[i], vals, false)
		if err != nil {
			return nil, err
		}
		recs = append(recs, rec)
	}
	return recs, nil
}

// evalEach runs script on each of keys (without the store's prefix), with
// args, in one pipeline (split by slot on a Cluster), and returns the
// calls in the order of keys; a call's own redis.Nil is left on it. The
// calls go as EVALSHA, as the store's other calls do: a script is several
// kilobytes (prelude.lua and its own), and EVAL would send it, and the
// server hash it, once per key. The calls that find a server without the
// script go again as EVAL, in a second pipeline.
func (s *Store) evalEach(ctx context.Context, script *script, keys []string, args ...any) ([]*redis.Cmd, error) {
	cmds := make([]*redis.Cmd, len(keys))
	todo := make([]int, len(keys))
	for i := range todo {
		todo[i] = i
	}
	for eval := false; ; eval = true {
		p := s.client.Pipeline()
		for _, i := range todo {
			cmd := script.command(s.prefix+keys[i], args)
			if eval {
				cmd = script.eval(cmd)
			}
			cmds[i] = p.Do(ctx, cmd...)
		}
		_, _ = p.Exec(ctx) // each call has its own error, the pipeline's if it failed
		retry := todo[:0]
		for _, i := range todo {
			switch err := cmds[i].Err(); {
			case err == nil || errors.Is(err, redis.Nil):
			case !eval && noScript(err):
				retry = append(retry, i)
			default:
				return nil, err
			}
		}
		if len(retry) == 0 {
			return cmds, nil
		}
		todo = retry
	}
}

// scan returns the keys (without the store's prefix) of every record whose
// key starts with prefix, from every master; a key may come twice.
func (s *Store) scan(ctx context.Context, prefix string) ([]string, error) {
	match := globEscape(s.prefix+prefix) + "*"
	var keys []string
	one := func(ctx context.Context, node *redis.Client) error {
		var cursor uint64
		for {
			batch, next, err := node.Scan(ctx, cursor, match, scanBatch).Result()
			if err != nil {
				return err
			}
			for _, k := range batch {
				keys = append(keys, strings.TrimPrefix(k, s.prefix))
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	var err error
	switch c := s.client.(type) {
	case *redis.Client:
		err = one(ctx, c)
	case *redis.ClusterClient:
		err = forEachSerially(ctx, c.ForEachMaster, one)
	case *redis.Ring:
		err = forEachSerially(ctx, c.ForEachShard, one)
	default: // New takes no other client
		return nil, fmt.Errorf("redisstore: cannot list on a %T", s.client)
	}
	if err != nil {
		return nil, opError(ctx, "scan", err)
	}
	return keys, nil
}

// forEachSerially runs fn on each node that each (ForEachMaster,
// ForEachShard) yields, one at a time: each runs its nodes concurrently.
func forEachSerially(ctx context.Context, each func(context.Context, func(context.Context, *redis.Client) error) error,
	fn func(context.Context, *redis.Client) error) error {
	var nodes []*redis.Client
	collect := make(chan *redis.Client)
	done := make(chan error, 1)
	go func() {
		done <- each(ctx, func(_ context.Context, c *redis.Client) error { collect <- c; return nil })
		close(collect)
	}()
	for c := range collect {
		nodes = append(nodes, c)
	}
	if err := <-done; err != nil {
		return err
	}
	for _, n := range nodes {
		if err := fn(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// globEscape escapes the characters SCAN's MATCH pattern gives a meaning.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
