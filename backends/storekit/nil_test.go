package storekit_test

import (
	"testing"

	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

type client interface{ Do() }

type impl struct{}

func (*impl) Do() {}

type fn func()

func (fn) Do() {}

func TestIsNil(t *testing.T) {
	var typedNil client = (*impl)(nil)
	var nilFunc client = fn(nil)
	for name, tc := range map[string]struct {
		v    any
		want bool
	}{
		"nil":             {nil, true},
		"typed nil":       {typedNil, true},
		"nil func":        {nilFunc, true},
		"pointer":         {&impl{}, false},
		"func":            {fn(func() {}), false},
		"value":           {42, false},
		"empty interface": {client(nil), true},
	} {
		if got := storekit.IsNil(tc.v); got != tc.want {
			t.Errorf("%s: IsNil = %v, want %v", name, got, tc.want)
		}
	}
}
