package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

// stateScript returns what Count needs of KEYS[1], without the
// record's output: {layout, seconds, microseconds, expiry (ms since the
// epoch, -1 for none), the record's first bytes} (layout 2), {layout, seconds, microseconds, s,
// le} for a 0.1.0 hash (layout 1), or false if it has no record. The
// first 512 bytes of a record hold its state, token, owner, attempt,
// retention and acquisition time.
var stateScript = redis.NewScript(`
local t = redis.call('TIME')
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'hash' then
  local v = redis.call('HMGET', KEYS[1], 's', 'le')
  return {1, t[1], t[2], v[1] or false, v[2] or false}
end
if kind == 'none' then
  return false
end
local at = redis.pcall('PEXPIRETIME', KEYS[1])
if type(at) ~= 'number' then
  at = redis.call('PTTL', KEYS[1])
  if at >= 0 then
    at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + at
  end
end
return {2, t[1], t[2], at, redis.call('GETRANGE', KEYS[1], 0, 511)}`)

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

// Count implements [backends.Lister], scanning as List does.
func (s *Store) Count(ctx context.Context, namespace string) (backends.Counts, error) {
	keys, err := s.scan(ctx, storekit.ListPrefix(namespace))
	if err != nil {
		return backends.Counts{}, err
	}
	slices.Sort(keys)
	keys = slices.Compact(keys) // SCAN may return a key twice
	var c backends.Counts
	for batch := range slices.Chunk(keys, scanBatch) {
		cmds, err := s.pipelined(ctx, func(p redis.Pipeliner) []*redis.Cmd {
			out := make([]*redis.Cmd, len(batch))
			for i, k := range batch {
				out[i] = stateScript.Eval(ctx, p, []string{s.prefix + k})
			}
			return out
		})
		if err != nil {
			return backends.Counts{}, opError(ctx, "count", err)
		}
		for _, cmd := range cmds {
			vals, err := cmd.Slice()
			if err != nil || len(vals) != 5 {
				continue // gone since the scan
			}
			if st, acquired, ok := countedState(vals); ok {
				storekit.AddCount(&c, st, acquired)
			}
		}
	}
	return c, nil
}

// countedState reads a reply of stateScript: the record's state and when
// its lease was acquired (zero for a 0.1.0 hash, which did not keep it);
// not ok for a string that is not a record.
func countedState(vals []any) (backends.State, time.Time, bool) {
	layout, _ := vals[0].(int64)
	now, ok := serverTime(vals[1], vals[2])
	if !ok {
		return 0, time.Time{}, false
	}
	if layout == 1 {
		st, _ := vals[3].(string)
		le, _ := vals[4].(string)
		leMs, _ := strconv.ParseInt(le, 10, 64)
		return legacyState(st, time.UnixMilli(leMs), now), time.Time{}, true
	}
	at, _ := vals[3].(int64)
	v, _ := vals[4].(string)
	rec, err := decodeRecord(v, true)
	if err != nil {
		return 0, time.Time{}, false
	}
	_, st := leaseState(rec, now, at)
	return st, rec.acquiredAt(at), true
}

// inspectMany inspects keys in one pipeline and returns the records that
// still exist, in the order of keys.
func (s *Store) inspectMany(ctx context.Context, keys []string) ([]backends.Record, error) {
	cmds, err := s.pipelined(ctx, func(p redis.Pipeliner) []*redis.Cmd {
		out := make([]*redis.Cmd, len(keys))
		for i, k := range keys {
			out[i] = inspectScript.Eval(ctx, p, []string{s.prefix + k})
		}
		return out
	})
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
		rec, err := parseRecord(keys[i], vals)
		if err != nil {
			return nil, err
		}
		recs = append(recs, rec)
	}
	return recs, nil
}

// pipelined sends the commands fn queues in one pipeline (split by slot on
// a Cluster) and returns them; a command's own error (such as redis.Nil)
// is left on the command.
func (s *Store) pipelined(ctx context.Context, fn func(p redis.Pipeliner) []*redis.Cmd) ([]*redis.Cmd, error) {
	p := s.client.Pipeline()
	cmds := fn(p)
	if _, err := p.Exec(ctx); err != nil {
		for _, c := range cmds {
			if e := c.Err(); e != nil && !errors.Is(e, redis.Nil) {
				return nil, e
			}
		}
	}
	return cmds, nil
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
