// Package memstore is an in-memory [backends.Store] for one process: tests,
// demos, and services that run a single consumer instance.
//
// Its records live in a map guarded by one mutex and vanish with the
// process, so it cannot protect against duplicates delivered to another
// process or after a restart. Use redisstore or pgstore for that.
//
// # Time and pruning
//
// Time comes from [Options.Now] (the wall clock by default), so tests can
// drive lease expiry without sleeping. Records past their retention are
// ignored at once and removed by a sweep that runs inside the store's own
// calls at most once per [Options.PruneInterval]: there is no background
// goroutine, so there is nothing to close.
package memstore
