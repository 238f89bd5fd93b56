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
// node. Each store operation is one round trip, an embedded Lua script run
// with EVALSHA and falling back to EVAL, so a SCRIPT FLUSH or a failover to
// a node that has not seen the script costs one extra round trip and no
// error. Every script checks the owner and the fencing token before it
// changes anything, and takes time from the server (TIME, PEXPIRE), never
// from the client.
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
