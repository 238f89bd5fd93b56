// Package redisstore is a [backends.Store] on Redis, for services that run
// several consumer instances.
//
//	client := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{"localhost:6379"}})
//	store, err := redisstore.New(client, redisstore.Options{Prefix: "myapp:idem:"})
//
// # Protocol
//
// Each key's record is one Redis hash, so every operation touches one key:
// it works unchanged on Redis Cluster, where a key's hash slot decides its
// node. Each store operation is one embedded Lua script run with EVALSHA
// and falling back to EVAL, so a SCRIPT FLUSH or a failover to a node that
// has not seen the script costs one extra round trip and no error. Every
// script checks the owner and the fencing token before it changes
// anything, and takes time from the server (TIME, PEXPIRE), never from the
// client.
//
// # Coalescing
//
// The store keeps at most four round trips in flight (per master of a
// Cluster; fewer with a smaller pool). A call that finds one of them free
// is sent at once, on its own; calls that arrive while all are busy are
// sent together, in one pipeline, as soon as one ends. Each call keeps its own context and its
// own error: a queued call whose context ends returns at once and is never
// sent. [CoalesceOff] sends every call on its own.
//
// # Waking waiting duplicates
//
// Complete, Release and Delete publish to the sharded pub/sub channel
// named as the key's Redis key (Redis 7 and later; older servers ignore
// it), so [Store.Watch] wakes the duplicates waiting for the key at once
// instead of leaving them to poll. Call [Store.Close] when the store is no
// longer needed, to end the subscriptions.
//
// # Record lifetime
//
// The hash expires (PEXPIRE) one retention after its lease expires, is
// released or is completed, so the fencing token keeps counting up across
// takeovers and releases for as long as a duplicate could still arrive.
//
// # Durability
//
// A record lives only as long as Redis keeps it. If Redis restarts without
// persistence, or fails over to a replica that had not received the latest
// writes, completed keys are forgotten (their duplicates run again),
// running handlers' renewals fail so their contexts are cancelled, and
// fencing tokens start again from 1. See docs/redis.md for the settings
// that match each guarantee.
package redisstore
