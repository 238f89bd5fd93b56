// Package outboxtest holds what the tests of both outbox packages share.
package outboxtest

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// ArriveAll fails the test unless every message named arrives on
// received within a minute, in any order, acking each: GoChannel delivers
// the messages of publishes that follow each other closely in no set
// order, and a Forwarder may publish a message twice.
func ArriveAll(t testing.TB, received <-chan *message.Message, uuids ...string) {
	t.Helper()
	missing := map[string]bool{}
	for _, u := range uuids {
		missing[u] = true
	}
	timeout := time.After(time.Minute)
	for len(missing) > 0 {
		select {
		case m := <-received:
			m.Ack()
			delete(missing, m.UUID)
		case <-timeout:
			t.Fatalf("not forwarded in a minute: %v", missing)
		}
	}
}
