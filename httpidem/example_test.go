package httpidem_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/httpidem"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// An order API whose POST /orders creates each order once, however often
// the client retries it with the same Idempotency-Key.
func Example() {
	store, err := memstore.New(memstore.Options{}) // redisstore, pgstore, … for more than one process
	if err != nil {
		panic(err)
	}
	idem, err := idempotency.New(idempotency.Config{Store: store, Namespace: "orders-api"})
	if err != nil {
		panic(err)
	}
	keys, err := httpidem.New(httpidem.Config{Idempotency: idem, Required: true})
	if err != nil {
		panic(err)
	}
	orders := 0
	mux := http.NewServeMux()
	mux.Handle("POST /orders", keys.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", orders))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d\n", orders)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	post := func(key, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		replayed := resp.Header.Get("Idempotent-Replayed") == "true"
		fmt.Printf("%d replayed=%v %s", resp.StatusCode, replayed, b) // every body ends with a newline
	}
	post(`"a1"`, `{"item":"book"}`) // created
	post(`"a1"`, `{"item":"book"}`) // the client's retry: the stored response
	post(`"a1"`, `{"item":"pen"}`)  // the key reused for another request
	post("", `{"item":"pen"}`)      // no key
	fmt.Println("orders created:", orders)
	// Output:
	// 201 replayed=false order 1
	// 201 replayed=true order 1
	// 422 replayed=false {"type":"about:blank","title":"Unprocessable Entity","status":422,"detail":"The Idempotency-Key was used with another request payload for this operation; use a new key for a new request."}
	// 400 replayed=false {"type":"about:blank","title":"Bad Request","status":400,"detail":"This operation is idempotent and requires an Idempotency-Key header."}
	// orders created: 1
}
