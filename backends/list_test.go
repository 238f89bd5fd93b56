package backends_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
)

// A namespace's range holds its keys and none of its neighbours'.
func TestListRequestRange(t *testing.T) {
	lower, upper := backends.ListRequest{Namespace: "orders"}.Range()
	require.Equal(t, "orders:", string(lower))
	require.Equal(t, "orders;", string(upper))
	for _, key := range []string{"orders:", "orders:a", "orders:\xff"} {
		require.True(t, key >= string(lower) && key < string(upper), key)
	}
	for _, key := range []string{"orders", "orders;", "ordersx:a", "order:a"} {
		require.False(t, key >= string(lower) && key < string(upper), key)
	}
	lower, upper = backends.ListRequest{}.Range()
	require.Empty(t, lower)
	require.Nil(t, upper, "every key")
}
