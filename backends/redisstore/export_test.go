package redisstore

import "time"

// QueuedCalls returns how many calls of s wait for a round trip.
func QueuedCalls(s *Store) int {
	c := s.calls
	n := c.lane.queued()
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, l := range c.lanes {
		n += l.queued()
	}
	return n
}

func (l *lane) queued() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.queue)
}

// NoStallEscape keeps the calls of s queued behind round trips in flight
// however long these take. It is called before s makes any call.
func NoStallEscape(s *Store) { s.calls.stall = time.Hour }
