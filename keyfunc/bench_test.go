package keyfunc_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/keyfunc"
)

// A typical event: the key near the front, a few hundred bytes of body.
var benchPayload = []byte(`{"order":{"id":"o-123456","customer":"c-99","lines":[` +
	strings.Repeat(`{"sku":"sku-1","qty":2,"price":"19.99"},`, 8) +
	`{"sku":"sku-9","qty":1,"price":"5.00"}],"total":"164.92"},"meta":{"source":"checkout","version":3}}`)

// BenchmarkJSONField compares the extractor with what a hand-rolled
// extractor on encoding/json would do, on the same payload.
func BenchmarkJSONField(b *testing.B) {
	m := message.NewMessage("u", benchPayload)
	b.Run("keyfunc", func(b *testing.B) {
		e := keyfunc.JSONField("order", "id")
		b.SetBytes(int64(len(benchPayload)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := e.Key(m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding_json_struct", func(b *testing.B) {
		b.SetBytes(int64(len(benchPayload)))
		b.ReportAllocs()
		for b.Loop() {
			var v struct {
				Order struct {
					ID string `json:"id"`
				} `json:"order"`
			}
			if err := json.Unmarshal(m.Payload, &v); err != nil || v.Order.ID == "" {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding_json_map", func(b *testing.B) {
		b.SetBytes(int64(len(benchPayload)))
		b.ReportAllocs()
		for b.Loop() {
			var v map[string]any
			if err := json.Unmarshal(m.Payload, &v); err != nil {
				b.Fatal(err)
			}
			if _, ok := v["order"].(map[string]any)["id"].(string); !ok {
				b.Fatal("no id")
			}
		}
	})
}

func BenchmarkExtractors(b *testing.B) {
	m := message.NewMessage("3f1c1a2e-6d1b-4f7e-9a55-1b2c3d4e5f60", benchPayload)
	m.Metadata.Set("Idempotency-Key", "pay-7")
	for _, e := range []struct {
		name string
		e    keyfunc.Extractor
	}{
		{"UUID", keyfunc.UUID()},
		{"Metadata", keyfunc.Metadata("Idempotency-Key")},
		{"PayloadHash", keyfunc.PayloadHash()},
	} {
		b.Run(e.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.e.Key(m); err != nil {
					b.Fatal(fmt.Sprint(err))
				}
			}
		})
	}
}
