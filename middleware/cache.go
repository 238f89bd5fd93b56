package middleware

import (
	"bytes"
	"container/list"
	"sync"
	"time"

	"github.com/watermill-idempotency/idempotency/backends"
)

// MaxCachedOutputBytes is the largest stored output the completed-key
// cache keeps: a completion with a bigger output is answered by the store
// every time, so the cache holds at most CompletedCache.Size times this
// many bytes of outputs.
const MaxCachedOutputBytes = 16 << 10

// CompletedCache configures a local cache of the keys known to be
// completed, so that a replayed topic or a redelivery storm costs no store
// call for a key this process has seen completed. The zero value is off.
//
// The cache is stale by design: an operator's `idem delete KEY` is not
// seen by a process that holds KEY in its cache until the entry's TTL has
// passed; until then duplicates of KEY are still dropped (and their stored
// output replayed). Keep TTL as short as that staleness can be tolerated.
// It applies to every door of the engine: the Watermill middleware, [Do]
// and package httpidem.
type CompletedCache struct {
	// Size is the most entries the cache holds; the least recently used
	// entry is evicted to make room. 0 turns the cache off.
	Size int
	// TTL is how long an entry is trusted. An entry never outlives the
	// record's retention as far as this process knows it (its completion
	// time plus Config.Retention). Required when Size is positive.
	TTL time.Duration
}

// completedCache is an LRU of completions, by full key. Only completions
// are cached: a key in progress or released must be asked of the store.
type completedCache struct {
	size int
	ttl  time.Duration
	now  func() time.Time

	mu    sync.Mutex
	lru   *list.List // of *cacheEntry, most recently used first
	byKey map[string]*list.Element
}

type cacheEntry struct {
	key     string
	res     backends.AcquireResult // Status Completed, Output, Fingerprint, CompletedAt
	expires time.Time
}

func newCompletedCache(c CompletedCache) *completedCache {
	if c.Size <= 0 {
		return nil
	}
	return &completedCache{size: c.Size, ttl: c.TTL, now: time.Now, lru: list.New(), byKey: make(map[string]*list.Element, c.Size)}
}

// get returns the completion cached for key, if one is still trusted.
func (c *completedCache) get(key string) (backends.AcquireResult, bool) {
	if c == nil {
		return backends.AcquireResult{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[key]
	if !ok {
		return backends.AcquireResult{}, false
	}
	e := el.Value.(*cacheEntry)
	if !c.now().Before(e.expires) {
		c.lru.Remove(el)
		delete(c.byKey, key)
		return backends.AcquireResult{}, false
	}
	c.lru.MoveToFront(el)
	// A copy of the output: a replayed message's payload may share its
	// bytes, and whoever receives it may change them.
	res := e.res
	res.Output = bytes.Clone(res.Output)
	return res, true
}

// put caches a completion of key whose record is kept until retainedUntil
// (zero if unknown).
func (c *completedCache) put(key string, res backends.AcquireResult, retainedUntil time.Time) {
	if c == nil || res.Status != backends.StatusCompleted || len(res.Output) > MaxCachedOutputBytes {
		return
	}
	now := c.now()
	expires := now.Add(c.ttl)
	if !retainedUntil.IsZero() && retainedUntil.Before(expires) {
		expires = retainedUntil
	}
	if !now.Before(expires) {
		return
	}
	// Copies: the caller's slices may be reused or changed later.
	res = backends.AcquireResult{Status: backends.StatusCompleted, CompletedAt: res.CompletedAt,
		Output: bytes.Clone(res.Output), Fingerprint: bytes.Clone(res.Fingerprint)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[key]; ok {
		el.Value = &cacheEntry{key: key, res: res, expires: expires}
		c.lru.MoveToFront(el)
		return
	}
	for c.lru.Len() >= c.size {
		last := c.lru.Back()
		c.lru.Remove(last)
		delete(c.byKey, last.Value.(*cacheEntry).key)
	}
	c.byKey[key] = c.lru.PushFront(&cacheEntry{key: key, res: res, expires: expires})
}

// len is the number of entries held, expired ones included.
func (c *completedCache) len() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}
