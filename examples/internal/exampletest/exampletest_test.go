package exampletest

import (
	"strings"
	"testing"
)

func TestEndsWithVerdict(t *testing.T) {
	ok := "  a line\n\nSummary:\n  orders: 3 = 2 charged + 1 refused\nCheck: fine.\n"
	if err := EndsWithVerdict(ok, "Check: "); err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]string{
		"an error after the verdict": ok + "redis: client is closed\n",
		"a failed check":             "Summary:\n  orders: 3 = 2 charged + 1 refused\nCheck FAILED: order o-1 charged 2 times\n",
		"no summary":                 "Check: fine.\n",
		"an empty summary":           "Summary:\nCheck: fine.\n",
		"a sum that does not add up": "Summary:\n  orders: 3 = 2 charged + 2 refused\nCheck: fine.\n",
		"a line that is no sum":      "Summary:\n  orders: 3 = 2 charged + 1 refused\n  3 orders\nCheck: fine.\n",
		"a term without a number":    "Summary:\n  orders: 3 = 3 charged + some refused\nCheck: fine.\n",
	} {
		if EndsWithVerdict(out, "Check: ") == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestParseSummary(t *testing.T) {
	out := "log line\nSummary:\n" +
		"  messages on the stream (XLEN): 43 = 22 first copies (one per order) + 20 second copies + 1 without an order id\n" +
		"  ledger: 22 charges = 22 orders charged + 0 charged again\n" +
		"Check: 22 orders charged once.\n"
	s, err := ParseSummary(out, "Check: ")
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 2 {
		t.Fatalf("%d sums, want 2: %+v", len(s), s)
	}
	m, err := s.Get("messages")
	if err != nil {
		t.Fatal(err)
	}
	if m.Label != "messages on the stream (XLEN)" || m.Total != 43 || m.TotalOf != "" || len(m.Parts) != 3 ||
		m.Parts[0] != (Part{22, "first copies (one per order)"}) || m.Parts[2] != (Part{1, "without an order id"}) {
		t.Errorf("parsed %+v", m)
	}
	l, _ := s.Get("ledger")
	if l.Total != 22 || l.TotalOf != "charges" {
		t.Errorf("parsed %+v", l)
	}

	e := Expect{Summary: s}
	e.Total("messages", 43)
	e.Part("messages", "second copies", 20)
	e.Part("ledger", "charged again", 0)
	if err := e.Err(); err != nil {
		t.Fatal(err)
	}
	e.Total("messages", 44)
	e.Part("ledger", "orders charged", 21)
	e.Part("ledger", "refunds", 0)
	e.Total("poison", 1)
	err = e.Err()
	if err == nil {
		t.Fatal("Expect found no difference")
	}
	for _, want := range []string{"the total is 43; the test saw 44", `"orders charged" is 22; the test saw 21`, `has no part "refunds"`, `0 summary lines labelled "poison"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v\ndoes not say %q", err, want)
		}
	}
}
