package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// The peers are what a team writes by hand instead of this middleware:
// the fewest round trips a lease with a completion mark can take, one to
// claim the key before the handler and one to mark it done after, each
// sent on its own, as a handler's code would send it. They have no
// fencing token, no owner check on completion, no renewal and no output
// to replay. A copy that finds its key claimed polls it until it is done
// (then it is dropped) or gone (then it fails, to come back). They run
// each key once here because nothing crashes and no lease runs out: they
// give the cost of two plain round trips per message on the same path.
const (
	peerLease     = 30 * time.Second
	peerRetention = time.Hour
	peerPoll      = 2 * time.Millisecond
)

// errPeerReleased fails a copy whose key's claim went away while it
// waited: the message comes back.
var errPeerReleased = errors.New("the key's claim was released")

// peer is a hand-written lease: claim takes key, or says it was done
// (done) or is claimed by another delivery (busy); finish marks it done;
// release drops the claim; state polls it. claim answers with the
// claim's token, which finish and release get back: empty, and unused,
// for a peer without an owner check.
type peer struct {
	claim   func(ctx context.Context, key string) (token string, done, busy bool, err error)
	finish  func(ctx context.Context, key, token string) error
	release func(ctx context.Context, key, token string) error
	state   func(ctx context.Context, key string) (done, gone bool, err error)
}

// middleware runs the handler under p, keyed by message UUID.
func (p peer) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		token, done, busy, err := p.claim(ctx, msg.UUID)
		for err == nil && busy {
			time.Sleep(peerPoll)
			var gone bool
			done, gone, err = p.state(ctx, msg.UUID)
			if err == nil && gone {
				err = errPeerReleased
			}
			busy = !done && err == nil
		}
		if err != nil || done {
			return nil, err
		}
		out, err := h(msg)
		if err != nil {
			_ = p.release(context.WithoutCancel(ctx), msg.UUID, token)
			return out, err
		}
		if err := p.finish(ctx, msg.UUID, token); err != nil {
			return nil, err
		}
		return out, nil
	}
}

// claimByInsert is a claim through insert, which reports whether it
// inserted the key's row with the claim's token, from newToken: if it did
// not, the key's state says whether it was done or is claimed, and a
// claim released meanwhile is tried again.
func (p peer) claimByInsert(newToken func() string, insert func(ctx context.Context, key, token string) (bool, error)) func(ctx context.Context, key string) (token string, done, busy bool, err error) {
	var claim func(ctx context.Context, key string) (string, bool, bool, error)
	claim = func(ctx context.Context, key string) (string, bool, bool, error) {
		token := newToken()
		inserted, err := insert(ctx, key, token)
		if err != nil || inserted {
			return token, false, false, err
		}
		done, gone, err := p.state(ctx, key)
		if err == nil && gone {
			return claim(ctx, key) // released in between: claim again
		}
		return "", done, !done, err
	}
	return claim
}

// noToken is the token of a claim without an owner check.
func noToken() string { return "" }

// newCasToken is the token of a claim with an owner check: its own.
func newCasToken() string { return "t" + strconv.FormatUint(casTokens.Add(1), 10) }

// finished is a peer's finish that changed affected rows: none means the
// key holds another claim's token.
func finished(affected int64, err error) error {
	if err == nil && affected == 0 {
		return errClaimLost
	}
	return err
}

// setupSetnx is the peer on Redis: SET NX PX GET to claim, SET PX to mark
// done, on a client of its own as redisstore has.
func setupSetnx(_ context.Context, e *env, id string, _ idempotency.Observer) (message.HandlerMiddleware, func(), error) {
	return setupRedisPeer(e, id, "setnx", func() string { return "claimed" },
		func(ctx context.Context, client *redis.Client, key, _ string) error {
			return client.Set(ctx, key, "done", peerRetention).Err()
		},
		func(ctx context.Context, client *redis.Client, key, _ string) error {
			return client.Del(ctx, key).Err()
		})
}

// Scripts of the peer with an owner check: each sets or deletes the key
// only while it still holds the claim's token, ARGV[1].
var (
	casFinish = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('SET', KEYS[1], 'done', 'PX', ARGV[2])
end
return false`)
	casRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)
)

// errClaimLost is the peer's finish of a claim that another took.
var errClaimLost = errors.New("e2ebench: the claim was lost: the key holds another token")

// casTokens numbers the claims of the peer with an owner check.
var casTokens atomic.Uint64

// setupCas is the peer on Redis with an owner check: SET NX PX GET of a
// token of the claim's own to claim, then a script that marks the key
// done, or drops the claim, only while the key still holds that token:
// the least a hand-written lease must add so that a delivery whose claim
// ran out and was taken does not mark the other's work done. Its token
// is no fencing token: it does not grow, and no sink sees it.
func setupCas(_ context.Context, e *env, id string, _ idempotency.Observer) (message.HandlerMiddleware, func(), error) {
	return setupRedisPeer(e, id, "cas",
		newCasToken,
		func(ctx context.Context, client *redis.Client, key, token string) error {
			err := casFinish.Run(ctx, client, []string{key}, token, peerRetention.Milliseconds()).Err()
			if errors.Is(err, redis.Nil) { // the script's false: another holds the key
				return errClaimLost
			}
			return err
		},
		func(ctx context.Context, client *redis.Client, key, token string) error {
			return casRelease.Run(ctx, client, []string{key}, token).Err()
		})
}

// setupRedisPeer is a peer on Redis, on a client of its own as redisstore
// has: a claim is SET NX PX GET of a value newToken gives (the claim's
// token), which finish replaces with "done" and release drops.
func setupRedisPeer(e *env, id, name string, newToken func() string,
	finish, release func(ctx context.Context, client *redis.Client, key, token string) error,
) (message.HandlerMiddleware, func(), error) {
	client := redis.NewClient(&redis.Options{Addr: e.cfg.redisAddr, ContextTimeoutEnabled: true, PoolSize: e.poolSize()})
	prefix := e.name(id, name) + ":"
	p := peer{
		claim: func(ctx context.Context, key string) (string, bool, bool, error) {
			token := newToken()
			prev, err := client.SetArgs(ctx, prefix+key, token, redis.SetArgs{Mode: "NX", TTL: peerLease, Get: true}).Result()
			switch {
			case errors.Is(err, redis.Nil):
				return token, false, false, nil
			case err != nil:
				return "", false, false, err
			}
			return "", prev == "done", prev != "done", nil
		},
		finish: func(ctx context.Context, key, token string) error {
			return finish(ctx, client, prefix+key, token)
		},
		release: func(ctx context.Context, key, token string) error {
			return release(ctx, client, prefix+key, token)
		},
		state: func(ctx context.Context, key string) (bool, bool, error) {
			v, err := client.Get(ctx, prefix+key).Result()
			if errors.Is(err, redis.Nil) {
				return false, true, nil
			}
			return v == "done", false, err
		},
	}
	return p.middleware, func() {
		_ = client.Close()
		e.deleteKeys(prefix + "*")
	}, nil
}

// setupInsert is the peer on Postgres: INSERT ON CONFLICT DO NOTHING to
// claim (and a SELECT when the key was there), UPDATE to mark done, on a
// pool of its own as pgstore has and a table like its own, keyed by text.
// With cas, the peer with an owner check (pg-cas): each claim inserts a
// token of its own, which its UPDATE and DELETE must find, and the table
// has an index on its expiry, which a cleanup of expired claims needs
// (Redis keeps one for every key with a TTL).
func setupInsert(cas bool) func(ctx context.Context, e *env, id string, _ idempotency.Observer) (message.HandlerMiddleware, func(), error) {
	return func(ctx context.Context, e *env, id string, _ idempotency.Observer) (message.HandlerMiddleware, func(), error) {
		pool, err := e.pgPool(ctx, map[bool]string{false: "pg-insert", true: "pg-cas"}[cas])
		if err != nil {
			return nil, nil, err
		}
		table := sqlName(e.name(id, "claims"))
		undo := func() {
			_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table)
			pool.Close()
		}
		schema := "CREATE TABLE " + table + " (key text PRIMARY KEY, done boolean NOT NULL DEFAULT false, expires_at timestamptz NOT NULL)"
		if cas {
			schema = "CREATE TABLE " + table + " (key text PRIMARY KEY, done boolean NOT NULL DEFAULT false, expires_at timestamptz NOT NULL, token text NOT NULL);" +
				" CREATE INDEX ON " + table + " (expires_at)"
		}
		if _, err := pool.Exec(ctx, schema); err != nil {
			undo()
			return nil, nil, err
		}
		if err := warmPool(ctx, pool, e.poolSize()); err != nil {
			undo()
			return nil, nil, err
		}
		claim := fmt.Sprintf("INSERT INTO %s (key, expires_at) VALUES ($1, now() + $2::interval) ON CONFLICT (key) DO NOTHING", table)
		state := fmt.Sprintf("SELECT done FROM %s WHERE key = $1", table)
		finish := fmt.Sprintf("UPDATE %s SET done = true, expires_at = now() + $2::interval WHERE key = $1", table)
		release := fmt.Sprintf("DELETE FROM %s WHERE key = $1 AND NOT done", table)
		newToken, withToken := noToken, func(args []any, _ string) []any { return args }
		if cas {
			claim = fmt.Sprintf("INSERT INTO %s (key, expires_at, token) VALUES ($1, now() + $2::interval, $3) ON CONFLICT (key) DO NOTHING", table)
			finish += " AND token = $3"
			release += " AND token = $2"
			newToken, withToken = newCasToken, func(args []any, token string) []any { return append(args, token) }
		}
		p := peer{
			state: func(ctx context.Context, key string) (bool, bool, error) {
				var done bool
				err := pool.QueryRow(ctx, state, key).Scan(&done)
				if errors.Is(err, pgx.ErrNoRows) {
					return false, true, nil
				}
				return done, false, err
			},
			finish: func(ctx context.Context, key, token string) error {
				tag, err := pool.Exec(ctx, finish, withToken([]any{key, peerRetention}, token)...)
				return finished(tag.RowsAffected(), err)
			},
			release: func(ctx context.Context, key, token string) error {
				_, err := pool.Exec(ctx, release, withToken([]any{key}, token)...)
				return err
			},
		}
		p.claim = p.claimByInsert(newToken, func(ctx context.Context, key, token string) (bool, error) {
			tag, err := pool.Exec(ctx, claim, withToken([]any{key, peerLease}, token)...)
			return tag.RowsAffected() == 1, err
		})
		return p.middleware, undo, nil
	}
}

// setupMysqlInsert is the peer on MariaDB or MySQL: INSERT IGNORE to claim
// (and a SELECT when the key was there), UPDATE to mark done, each
// statement prepared once, on a *sql.DB of its own as mysqlstore has and
// a table keyed by the message UUID. With cas, the peer with an owner
// check (mysql-cas), as setupInsert's.
func setupMysqlInsert(cas bool) func(ctx context.Context, e *env, id string, _ idempotency.Observer) (message.HandlerMiddleware, func(), error) {
	return func(ctx context.Context, e *env, id string, _ idempotency.Observer) (message.HandlerMiddleware, func(), error) {
		db, err := e.mysqlDB(map[bool]string{false: "mysql-insert", true: "mysql-cas"}[cas])
		if err != nil {
			return nil, nil, err
		}
		table := "`" + sqlName(e.name(id, "claims")) + "`"
		var stmts []*sql.Stmt
		undo := func() {
			for _, st := range stmts {
				_ = st.Close()
			}
			_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table)
			db.Close()
		}
		schema := "CREATE TABLE " + table + " (`key` VARBINARY(255) PRIMARY KEY, done BOOLEAN NOT NULL DEFAULT FALSE, expires_at DATETIME(6) NOT NULL"
		if cas {
			schema += ", token VARBINARY(32) NOT NULL, INDEX (expires_at)"
		}
		if _, err := db.ExecContext(ctx, schema+")"); err != nil {
			undo()
			return nil, nil, err
		}
		prepare := func(q string) *sql.Stmt {
			st, perr := db.PrepareContext(ctx, q)
			if perr != nil {
				err = errors.Join(err, perr)
				return nil
			}
			stmts = append(stmts, st)
			return st
		}
		claimSQL := "INSERT IGNORE INTO " + table + " (`key`, expires_at) VALUES (?, NOW(6) + INTERVAL ? MICROSECOND)"
		finishSQL := "UPDATE " + table + " SET done = TRUE, expires_at = NOW(6) + INTERVAL ? MICROSECOND WHERE `key` = ?"
		releaseSQL := "DELETE FROM " + table + " WHERE `key` = ? AND NOT done"
		newToken, withToken := noToken, func(args []any, _ string) []any { return args }
		if cas {
			claimSQL = "INSERT IGNORE INTO " + table + " (`key`, expires_at, token) VALUES (?, NOW(6) + INTERVAL ? MICROSECOND, ?)"
			finishSQL += " AND token = ?"
			releaseSQL += " AND token = ?"
			newToken, withToken = newCasToken, func(args []any, token string) []any { return append(args, token) }
		}
		claim := prepare(claimSQL)
		state := prepare("SELECT done FROM " + table + " WHERE `key` = ?")
		finish := prepare(finishSQL)
		release := prepare(releaseSQL)
		if err == nil {
			err = warmDB(ctx, db, e.poolSize())
		}
		if err != nil {
			undo()
			return nil, nil, err
		}
		p := peer{
			state: func(ctx context.Context, key string) (bool, bool, error) {
				var done bool
				err := state.QueryRowContext(ctx, key).Scan(&done)
				if errors.Is(err, sql.ErrNoRows) {
					return false, true, nil
				}
				return done, false, err
			},
			finish: func(ctx context.Context, key, token string) error {
				res, err := finish.ExecContext(ctx, withToken([]any{peerRetention.Microseconds(), key}, token)...)
				if err != nil {
					return err
				}
				return finished(res.RowsAffected())
			},
			release: func(ctx context.Context, key, token string) error {
				_, err := release.ExecContext(ctx, withToken([]any{key}, token)...)
				return err
			},
		}
		p.claim = p.claimByInsert(newToken, func(ctx context.Context, key, token string) (bool, error) {
			res, err := claim.ExecContext(ctx, withToken([]any{key, peerLease.Microseconds()}, token)...)
			if err != nil {
				return false, err
			}
			n, err := res.RowsAffected()
			return n == 1, err
		})
		return p.middleware, undo, nil
	}
}
