package keyfunc_test

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/keyfunc"
)

func ExampleJSONField() {
	key := keyfunc.JSONField("order", "id")
	k, err := key.Key(message.NewMessage("m-1", []byte(`{"order":{"id":"o-42","total":10}}`)))
	fmt.Println(k, err)

	_, err = key.Key(message.NewMessage("m-2", []byte(`{"order":{}}`)))
	fmt.Println(errors.Is(err, keyfunc.ErrNoKey))
	// Output:
	// o-42 <nil>
	// true
}

func ExampleFirst() {
	// Prefer the producer's Idempotency-Key; fall back to the message UUID.
	key := keyfunc.First(keyfunc.Metadata("Idempotency-Key"), keyfunc.UUID())

	withHeader := message.NewMessage("m-1", nil)
	withHeader.Metadata.Set("Idempotency-Key", "pay-7")
	k1, _ := key.Key(withHeader)
	k2, _ := key.Key(message.NewMessage("m-2", nil))
	fmt.Println(k1, k2)
	// Output: pay-7 m-2
}

func ExampleFunc() {
	// The user's own key: tenant and event id from metadata.
	key := keyfunc.Func(func(m *message.Message) (string, error) {
		tenant, id := m.Metadata.Get("tenant"), m.Metadata.Get("event_id")
		if tenant == "" || id == "" {
			return "", fmt.Errorf("%w: tenant and event_id are required", keyfunc.ErrNoKey)
		}
		return tenant + "/" + id, nil
	})
	m := message.NewMessage("m-1", nil)
	m.Metadata.Set("tenant", "acme")
	m.Metadata.Set("event_id", "e-9")
	fmt.Println(key.Key(m))
	// Output: acme/e-9 <nil>
}

func ExampleHashed() {
	key := keyfunc.Hashed(keyfunc.JSONField("request"))
	k, _ := key.Key(message.NewMessage("m-1", []byte(`{"request":"a long free-text request body"}`)))
	fmt.Println(len(k))
	// Output: 64
}
