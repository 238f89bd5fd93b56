// Package redisstore is a [backends.Store] on Redis, for services that run
// several consumer instances.
//
//	client := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{"localhost:6379"}})
//	store, err := redisstore.New(client, redisstore.Options{Prefix: "myapp:idem:"})
//
// # Protocol
//
// Each key's record is one Redis string, so every operation touches one
// key: it works unchanged on Redis Cluster, where a key's hash slot
// decides its node. The client encodes a fresh key's record itself, and
// Acquire's fast path is one plain command, SET NX PX GET: it takes a new
// key, and returns a completed key's record (its output included) without
// writing. The key expires one retention after the lease (PX lease TTL +
// retention), so the lease is live while the key's PTTL exceeds the
// retention: neither Acquire's fast path nor Complete needs the clock.
// Everything else (a key in progress, released or expired, a re-entrant
// acquire, a record written by 0.1.0) goes to a script, as do Complete,
// Renew and Release: small compare-and-set scripts that check the owner
// and the fencing token before they change anything. Scripts run with
// EVALSHA and fall back to EVAL, so a SCRIPT FLUSH or a failover to a
// node that has not seen the script costs one extra round trip and no
// error. Records 0.1.0 wrote (hashes) are read as before; a lease taken
// on one rewrites it in the new layout (see docs/upgrading.md).
//
// # Coalescing
//
// Up to eight calls at once (per master of a Cluster; at most half the
// client's PoolSize) are sent each on its own, on the caller's goroutine,
// as without coalescing. A call that finds them all in flight queues, and
// the queue goes as one pipeline as soon as one of them ends; while the
// queue drains, every call joins it, and the next batch collects while
// the pipeline is out. Once the queue holds four calls and half as many
// as the pipelines in flight carry on average, it goes as another
// pipeline without waiting for them, up to four in flight, so that the
// server runs one batch while the client handles another. No call waits
// for a timer. Each call keeps its own context and its own error: a queued
// call whose context ends returns at once and is never sent. Round trips
// that make no progress for 10 ms (a slow command, a dead connection) let
// the queue go on another connection (up to twelve round trips in flight
// in all, at most the PoolSize), so renewals never wait behind them. [CoalesceOff] sends every call on its
// own.
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
// The record expires one retention after its lease expires, is released
// or is completed, so the fencing token keeps counting up across
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
