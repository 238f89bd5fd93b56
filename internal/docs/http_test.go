package docs

import (
	"errors"
	"net/http"
	"time"

	"github.com/watermill-idempotency/idempotency/backends/redisstore"
)

// snippet:http
import (
	"github.com/watermill-idempotency/idempotency/httpidem"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// end snippet

var _ = ordersAPI

func ordersAPI(store *redisstore.Store, createOrder, getOrder http.HandlerFunc, accountOf func(*http.Request) string) (http.Handler, error) {
	// snippet:http
	idem, err := idempotency.New(idempotency.Config{
		Store:     store,          // any store; the same one the message handlers use is fine
		Namespace: "orders-api",   // required: the requests' key space
		LeaseTTL:  time.Minute,    // renewed while the handler runs
		Retention: 24 * time.Hour, // the expiry policy to publish: a key is kept a day after its response
	})
	if err != nil {
		return nil, err
	}
	keys, err := httpidem.New(httpidem.Config{
		Idempotency: idem,
		Required:    true, // 400 without the header
		Scope: func(r *http.Request) (string, error) {
			// Whose key it is: two clients may choose the same one.
			if account := accountOf(r); account != "" {
				return account, nil
			}
			return "", errors.New("no account")
		},
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", keys.Handler(createOrder)) // the unsafe methods get the middleware
	mux.Handle("GET /orders/{id}", getOrder)              // safe ones need none
	// end snippet
	return mux, nil
}
