package exampletest

import "testing"

func TestEndsWithVerdict(t *testing.T) {
	ok := "  a line\n\nSummary: 3 orders\nCheck: fine.\n"
	if err := EndsWithVerdict(ok, "Check: "); err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]string{
		"an error after the verdict": ok + "redis: client is closed\n",
		"a failed check":             "Summary: 3 orders\nCheck FAILED: order o-1 charged 2 times\n",
		"no summary":                 "Check: fine.\n",
	} {
		if EndsWithVerdict(out, "Check: ") == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
