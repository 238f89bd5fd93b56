// Package floors holds the test that keeps the repository's packages on
// their floors: the store contract and the stores at the bottom, the key
// functions above them, the middleware above those, and the doors, the
// conformance suite, contrib, commands, examples and everything else at
// the top. A package imports only packages on its own floor or below, so
// a store never drags in the middleware it serves, and the suite that
// drives a store through the middleware is above both.
//
// The rule applies to what a package's own code imports, in every module
// of the workspace; tests may import from any floor (a store's tests run
// the conformance suite). docs/development.md describes the floors.
package floors
