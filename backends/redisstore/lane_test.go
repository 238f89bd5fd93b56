package redisstore

import (
	"context"
	"testing"
)

// What a round trip of a lane does with the queue as it ends: go on with
// it (a drainer) or give its connection back, leaving the queue to the
// pipelines in flight. The stall escape can put more than laneDepth
// pipelines in flight; as they end, the lane goes back to laneDepth.
func TestLaneNext(t *testing.T) {
	for _, tc := range []struct {
		name     string
		drainer  bool // the round trip ending was a pipeline of the queue
		drainers int  // pipelines in flight, the one ending included
		flying   int  // calls in them
		sent     int  // calls in the one ending
		queued   int
		keep     bool
	}{
		{"the only pipeline takes any queue", true, 1, 1, 1, 1, true},
		{"a call on its own takes the queue when no pipeline drains it", false, 0, 0, 0, 1, true},
		{"a call on its own leaves the queue to a pipeline in flight", false, 1, 10, 0, 10, false},
		{"too few calls for a pipeline beside another", true, 2, 20, 10, moreBatch - 1, false},
		{"fewer than half the average in flight", true, 2, 30, 10, 9, false},
		{"half the average in flight", true, 2, 30, 10, 10, true},
		{"beside three others, the fourth goes on", true, 4, 16, 4, 4, true},
		{"after a stall, the fifth gives its connection back", true, 5, 20, 4, 100, false},
		{"an empty queue", true, 1, 1, 1, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &coalescer{} // no slots: no stall timer
			l := &lane{drainers: tc.drainers, inflight: tc.drainers, flying: tc.flying}
			if !tc.drainer {
				l.inflight++ // the call on its own
			}
			for range tc.queued {
				l.queue = append(l.queue, &call{ctx: context.Background()})
			}
			inflight := l.inflight
			batch, ok := l.next(c, nil, tc.drainer, tc.sent)
			if ok != tc.keep {
				t.Fatalf("next kept the slot: %v, want %v", ok, tc.keep)
			}
			wantDrainers, wantInflight, wantFlying := tc.drainers, inflight, tc.flying-tc.sent
			switch {
			case ok:
				if len(batch) != tc.queued || len(l.queue) != 0 {
					t.Fatalf("took %d of %d queued calls, %d left", len(batch), tc.queued, len(l.queue))
				}
				wantFlying += tc.queued
				if !tc.drainer {
					wantDrainers++
				}
			default:
				if len(l.queue) != tc.queued {
					t.Fatalf("%d calls left queued, want %d", len(l.queue), tc.queued)
				}
				wantInflight--
				if tc.drainer {
					wantDrainers--
				}
			}
			if l.drainers != wantDrainers || l.inflight != wantInflight || l.flying != wantFlying {
				t.Fatalf("drainers %d, in flight %d, flying %d; want %d, %d, %d",
					l.drainers, l.inflight, l.flying, wantDrainers, wantInflight, wantFlying)
			}
		})
	}
}
