package storekit

import "reflect"

// IsNil reports whether v is nil or an interface holding a nil pointer,
// map, slice, func or channel: a typed nil, such as a (*redis.Client)(nil)
// passed as a redis.UniversalClient, which compares unequal to nil but
// panics at its first use.
//
// A store's constructor checks its client with it and returns an error
// wrapping backends.ErrNilClient instead. The library's own constructors
// check what they are given with it too: the middleware its Store,
// Observer and Codec, contrib/idemotel the store it wraps and its
// providers, contrib/awssqs its client, contrib/sqloutbox its database and
// store.
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
