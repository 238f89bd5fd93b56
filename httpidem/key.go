package httpidem

import (
	"errors"
	"fmt"
	"strings"
)

// parseKey returns the key an Idempotency-Key header value carries: a
// Structured Field String (RFC 8941: printable ASCII between double
// quotes, with \" and \\ escaped), as the draft defines it; or, leniently,
// a bare token of visible ASCII without quotes, commas, semicolons or
// spaces, as many clients send. Whitespace around the value is ignored.
func parseKey(v string) (string, error) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return "", errors.New("it is empty")
	}
	if v[0] != '"' {
		for i := 0; i < len(v); i++ {
			if c := v[i]; c <= ' ' || c >= 0x7f || c == '"' || c == ',' || c == ';' || c == '\\' {
				return "", fmt.Errorf("%q is neither a quoted string nor a token", v)
			}
		}
		return v, nil
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", errors.New("a backslash escapes only \" and \\ in a quoted string")
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", errors.New("the quoted string is followed by more")
			}
			if b.Len() == 0 {
				return "", errors.New("it is empty")
			}
			return b.String(), nil
		case c < ' ' || c >= 0x7f:
			return "", errors.New("a quoted string holds printable ASCII only")
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("the quoted string is not closed")
}
