package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// ledger is the business store: one entry per order, in Redis here. A
// charge is written with the fencing token of the lease it ran under, and
// refused when the token is lower than the highest the order's entry has
// seen: a consumer whose lease was taken over (it paused, or lost its
// connection) cannot charge an order someone else has charged since.
type ledger struct {
	client *redis.Client
	prefix string
}

// errStale is returned for a charge under a fencing token lower than the
// one the order's entry holds.
var errStale = errors.New("ledger: stale fencing token refused")

// recordCharge writes a charge to an order's entry, if its token (ARGV[1])
// is at least the entry's. The same token again is the same lease
// retrying: applied already. charges counts the charges applied.
var recordCharge = redis.NewScript(`
local applied = tonumber(redis.call('HGET', KEYS[1], 'token') or '0')
local token = tonumber(ARGV[1])
if token < applied then return -1 end
if token == applied then return 0 end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'amount_cents', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'charges', 1)
return 1
`)

// record charges o under the fencing token.
func (l *ledger) record(ctx context.Context, o order, token int64) error {
	n, err := recordCharge.Run(ctx, l.client, []string{l.prefix + o.ID}, token, o.AmountCents).Int()
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	if n < 0 {
		return fmt.Errorf("%w: order %s, token %d", errStale, o.ID, token)
	}
	return nil
}

// entry is an order's ledger entry.
type entry struct {
	// Token is the fencing token of the charge applied last.
	Token int64
	// Charges counts the charges applied: 1 is the promise.
	Charges int64
}

// entries returns every order's entry.
func (l *ledger) entries(ctx context.Context) (map[string]entry, error) {
	out := map[string]entry{}
	iter := l.client.Scan(ctx, 0, l.prefix+"*", 100).Iterator()
	for iter.Next(ctx) {
		h, err := l.client.HGetAll(ctx, iter.Val()).Result()
		if err != nil {
			return nil, err
		}
		var e entry
		e.Token, _ = strconv.ParseInt(h["token"], 10, 64)
		e.Charges, _ = strconv.ParseInt(h["charges"], 10, 64)
		out[iter.Val()[len(l.prefix):]] = e
	}
	return out, iter.Err()
}
