package dynamostore

import "time"

// SetClock makes s read the time from now: the tests move it by hand.
func SetClock(s *Store, now func() time.Time) { s.now = now }

// MaxRounds is maxRounds: the writes one Acquire tries.
const MaxRounds = maxRounds

// ContentionPause is contentionPause.
var ContentionPause = contentionPause
