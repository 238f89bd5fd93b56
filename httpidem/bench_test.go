package httpidem_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/watermill-idempotency/idempotency/backends/memstore"
	"github.com/watermill-idempotency/idempotency/httpidem"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// BenchmarkHandler measures the middleware on the in-memory store without
// a network, a new key each time and a completed key, against the handler
// alone. benchmarks/httpbench measures it over loopback HTTP, on Redis
// too, against a hand-written middleware.
func BenchmarkHandler(b *testing.B) {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	idem, err := idempotency.New(idempotency.Config{Store: store, Namespace: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	mw, err := httpidem.New(httpidem.Config{Idempotency: idem, Required: true})
	if err != nil {
		b.Fatal(err)
	}
	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/o-1")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"o-1","bytes":%d}`, len(body))
	})
	serve := func(b *testing.B, h http.Handler, key string) {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"book","amount":1200}`))
		req.Header.Set(httpidem.Header, key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusCreated {
			b.Fatal(w.Code, w.Body.String())
		}
	}
	h := mw.Handler(create)
	b.Run("plain", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			serve(b, create, `"k"`)
		}
	})
	b.Run("new-key", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			serve(b, h, strconv.Quote(b.Name()+strconv.Itoa(i)))
		}
	})
	b.Run("replay", func(b *testing.B) {
		serve(b, h, `"dup"`)
		b.ReportAllocs()
		for b.Loop() {
			serve(b, h, `"dup"`)
		}
	})
}
