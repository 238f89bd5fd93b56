package keyfunc_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/keyfunc"
)

func msg(uuid, payload string, md ...string) *message.Message {
	m := message.NewMessage(uuid, []byte(payload))
	for i := 0; i+1 < len(md); i += 2 {
		m.Metadata.Set(md[i], md[i+1])
	}
	return m
}

func TestExtractors(t *testing.T) {
	order := `{"order":{"id":"o-1","n":42,"f":4.50,"empty":"","nul":null,"yes":true,"obj":{},"arr":[1]},"a.b":"dotted","*":"star"}`
	tests := []struct {
		name    string
		e       keyfunc.Extractor
		msg     *message.Message
		want    string
		wantErr error
	}{
		{"uuid", keyfunc.UUID(), msg("u-1", ""), "u-1", nil},
		{"uuid empty", keyfunc.UUID(), msg("", "x"), "", keyfunc.ErrNoKey},
		{"metadata", keyfunc.Metadata("Idempotency-Key"), msg("u", "", "Idempotency-Key", "abc"), "abc", nil},
		{"metadata missing", keyfunc.Metadata("Idempotency-Key"), msg("u", ""), "", keyfunc.ErrNoKey},
		{"metadata empty", keyfunc.Metadata("k"), msg("u", "", "k", ""), "", keyfunc.ErrNoKey},
		{"json nested string", keyfunc.JSONField("order", "id"), msg("u", order), "o-1", nil},
		{"json integer", keyfunc.JSONField("order", "n"), msg("u", order), "42", nil},
		{"json number kept as written", keyfunc.JSONField("order", "f"), msg("u", order), "4.50", nil},
		{"json name with a dot", keyfunc.JSONField("a.b"), msg("u", order), "dotted", nil},
		{"json name that is a wildcard", keyfunc.JSONField("*"), msg("u", order), "star", nil},
		{"json escaped string", keyfunc.JSONField("k"), msg("u", `{"k":"a\"b\u00e9"}`), `a"bé`, nil},
		{"json missing", keyfunc.JSONField("order", "nope"), msg("u", order), "", keyfunc.ErrNoKey},
		{"json missing parent", keyfunc.JSONField("nope", "id"), msg("u", order), "", keyfunc.ErrNoKey},
		{"json empty string", keyfunc.JSONField("order", "empty"), msg("u", order), "", keyfunc.ErrNoKey},
		{"json null", keyfunc.JSONField("order", "nul"), msg("u", order), "", keyfunc.ErrUnsupportedValue},
		{"json bool", keyfunc.JSONField("order", "yes"), msg("u", order), "", keyfunc.ErrUnsupportedValue},
		{"json object", keyfunc.JSONField("order", "obj"), msg("u", order), "", keyfunc.ErrUnsupportedValue},
		{"json array", keyfunc.JSONField("order", "arr"), msg("u", order), "", keyfunc.ErrUnsupportedValue},
		{"json malformed", keyfunc.JSONField("id"), msg("u", `{"id":"x",`), "", keyfunc.ErrMalformedPayload},
		{"json not json", keyfunc.JSONField("id"), msg("u", `hello`), "", keyfunc.ErrMalformedPayload},
		{"json empty payload", keyfunc.JSONField("id"), msg("u", ``), "", keyfunc.ErrMalformedPayload},
		{"json top-level array", keyfunc.JSONField("id"), msg("u", `[{"id":"x"}]`), "", keyfunc.ErrNoKey},
		{"hash", keyfunc.PayloadHash(), msg("u", "abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", nil},
		{"hash empty payload", keyfunc.PayloadHash(), msg("u", ""), "", keyfunc.ErrNoKey},
		{"first takes the first found", keyfunc.First(keyfunc.Metadata("k"), keyfunc.UUID()), msg("u-2", "", "k", "meta"), "meta", nil},
		{"first falls back", keyfunc.First(keyfunc.Metadata("k"), keyfunc.UUID()), msg("u-2", ""), "u-2", nil},
		{"first none found", keyfunc.First(keyfunc.Metadata("k"), keyfunc.JSONField("id")), msg("u", "bad"), "", keyfunc.ErrMalformedPayload},
		{"composite", keyfunc.Composite("/", keyfunc.Metadata("tenant"), keyfunc.JSONField("order", "id")), msg("u", order, "tenant", "t1"), "t1/o-1", nil},
		{"composite part missing", keyfunc.Composite("/", keyfunc.Metadata("tenant"), keyfunc.UUID()), msg("u", ""), "", keyfunc.ErrNoKey},
		{"hashed", keyfunc.Hashed(keyfunc.Metadata("k")), msg("u", "", "k", "abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", nil},
		{"hashed passes errors on", keyfunc.Hashed(keyfunc.Metadata("k")), msg("u", ""), "", keyfunc.ErrNoKey},
		{"func", keyfunc.Func(func(m *message.Message) (string, error) { return strings.ToUpper(m.UUID), nil }), msg("abc", ""), "ABC", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, keyfunc.Validate(tc.e))
			got, err := tc.e.Key(tc.msg)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				require.Empty(t, got)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestFirstJoinsAllErrors(t *testing.T) {
	_, err := keyfunc.First(keyfunc.Metadata("k"), keyfunc.JSONField("id")).Key(msg("u", "bad"))
	require.ErrorIs(t, err, keyfunc.ErrNoKey)
	require.ErrorIs(t, err, keyfunc.ErrMalformedPayload)
}

func TestValidate(t *testing.T) {
	var nilFunc keyfunc.Func
	for name, e := range map[string]keyfunc.Extractor{
		"nil":                    nil,
		"nil func":               nilFunc,
		"metadata without name":  keyfunc.Metadata(""),
		"json without path":      keyfunc.JSONField(),
		"json with empty name":   keyfunc.JSONField("order", ""),
		"first without parts":    keyfunc.First(),
		"first with a bad part":  keyfunc.First(keyfunc.UUID(), keyfunc.Metadata("")),
		"composite without part": keyfunc.Composite(":"),
		"hashed bad inner":       keyfunc.Hashed(keyfunc.JSONField()),
		"hashed nil":             keyfunc.Hashed(nil),
	} {
		require.ErrorIs(t, keyfunc.Validate(e), keyfunc.ErrInvalidExtractor, name)
	}
}

func TestExtractorsDoNotModifyTheMessage(t *testing.T) {
	m := msg("u", `{"id":"x"}`, "k", "v")
	for _, e := range []keyfunc.Extractor{keyfunc.UUID(), keyfunc.Metadata("k"), keyfunc.JSONField("id"), keyfunc.PayloadHash()} {
		_, err := e.Key(m)
		require.NoError(t, err)
	}
	require.Equal(t, `{"id":"x"}`, string(m.Payload))
	require.Equal(t, message.Metadata{"k": "v"}, m.Metadata)
}

// FuzzJSONField checks that the JSON extractor agrees with encoding/json
// on which payloads are valid, and never panics.
func FuzzJSONField(f *testing.F) {
	for _, s := range []string{`{"id":"x"}`, `{"id":1e3}`, `{"id":"a\u0000b"}`, `{"id":`, `[]`, `{"id":{"id":"y"}}`, "\xff"} {
		f.Add([]byte(s))
	}
	e := keyfunc.JSONField("id")
	f.Fuzz(func(t *testing.T, payload []byte) {
		key, err := e.Key(message.NewMessage("u", payload))
		if json.Valid(payload) != !errors.Is(err, keyfunc.ErrMalformedPayload) {
			t.Fatalf("validity disagrees with encoding/json for %q: %v", payload, err)
		}
		if err == nil && key == "" {
			t.Fatal("empty key without an error")
		}
	})
}
