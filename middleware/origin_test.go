package middleware_test

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	"github.com/watermill-idempotency/idempotency/middleware"
)

// The record tells which delivery completed its key: the message's UUID
// and the handler, as AcquireRequest.Origin, made fit for every store.
func TestRecordNamesTheDeliveryThatCompletedIt(t *testing.T) {
	store := newMemstore()
	m, counters := newMiddleware(t, store, func(c *middleware.Config) { c.Key = keyfunc.Metadata("k") })
	e := newPoisonEnv(t, m, middleware.IsPoison, func(*message.Message) ([]*message.Message, error) { return nil, nil })
	long := strings.Repeat("é", 200) // 400 bytes
	e.publish(t, "in", keyed("m1", "a", "x"), keyed("with space", "b", "x"), keyed(long, "c", "x"), keyed("nul\x00\xff", "d", "x"))
	waitFor(t, "processed", func() bool { return counters.Count(middleware.OutcomeProcessed) == 4 })
	for key, want := range map[string]string{
		"test:a": "message_uuid=m1 handler=h",
		"test:b": `message_uuid="with space" handler=h`,
		"test:d": "message_uuid=nul\uFFFD handler=h",
	} {
		rec, err := store.Inspect(context.Background(), key)
		require.NoError(t, err)
		require.Equal(t, want, rec.Origin, key)
		require.Equal(t, backends.StateCompleted, rec.State)
	}
	rec, err := store.Inspect(context.Background(), "test:c")
	require.NoError(t, err)
	require.LessOrEqual(t, len(rec.Origin), backends.MaxOriginBytes)
	require.True(t, utf8.ValidString(rec.Origin), "cut between runes")
	require.True(t, strings.HasPrefix(rec.Origin, "message_uuid=éé"))
}
