// Package sqlschema prepares the stores' embedded schema files for the
// users who run them with their own migration tools.
package sqlschema

import "strings"

// WithoutSnippetMarks returns schema without the comment lines that mark
// the part the docs quote ("-- snippet:NAME" and "-- end snippet"): they
// mean nothing to whoever runs it.
func WithoutSnippetMarks(schema string) string {
	var b strings.Builder
	for line := range strings.Lines(schema) {
		if t := strings.TrimSpace(line); t != "-- end snippet" && !strings.HasPrefix(t, "-- snippet:") {
			b.WriteString(line)
		}
	}
	return b.String()
}
