// Package output checks what the examples print.
package output

import (
	"fmt"
	"strings"
)

// EndsWithVerdict returns an error unless out ends with a line starting
// with "Summary: " followed by one starting with check: nothing, an error
// least of all, may be printed after an example's summary and verdict.
func EndsWithVerdict(out, check string) error {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[len(lines)-2], "Summary: ") || !strings.HasPrefix(lines[len(lines)-1], check) {
		return fmt.Errorf("the output does not end with its summary and %q:\n%s", check, out)
	}
	return nil
}
