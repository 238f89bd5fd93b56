package storekit

import "reflect"

// IsNil reports whether v is nil or an interface holding a nil pointer,
// map, slice, func or channel: a typed nil, such as a (*redis.Client)(nil)
// passed as a redis.UniversalClient, which compares unequal to nil but
// panics at its first use. A constructor checks its client with it and
// returns an error wrapping backends.ErrNilClient instead.
func IsNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return rv.IsNil()
	}
	return false
}
