package sqlschema

import "testing"

func TestWithoutSnippetMarks(t *testing.T) {
	in := "-- The table.\n-- snippet:schema\nCREATE TABLE t (\n  -- snippet: inside a statement stays a comment line to drop\n  k int\n);\n  -- end snippet\n"
	want := "-- The table.\nCREATE TABLE t (\n  k int\n);\n"
	if got := WithoutSnippetMarks(in); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
