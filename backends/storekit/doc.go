// Package storekit is for store authors: what the stores of this
// repository share beyond the contract in package backends, for a
// third-party store to share too. Users of the middleware do not need it.
//
// A store runs [backends/storetest] against itself to prove that it keeps
// the contract.
package storekit
