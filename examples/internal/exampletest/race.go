//go:build race

package exampletest

// raceEnabled is set when the tests run with -race: the examples are then
// built with it too.
const raceEnabled = true
