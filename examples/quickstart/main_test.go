package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/watermill-idempotency/idempotency/examples/internal/exampletest"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// The quickstart's summary adds up, and says what its output shows: the
// test counts the messages under "Publishing:", the deliveries under
// "What happened:" by what happened to each, and the charges per order.
func TestQuickstart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	if _, err := run(ctx, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	summary, err := exampletest.ParseSummary(out.String(), "Check: 6 orders charged once each")
	if err != nil {
		t.Fatal(err)
	}

	published, happened := section(out.String(), "Publishing:"), section(out.String(), "What happened:")
	orders := map[string]bool{}
	for _, line := range published {
		orders[strings.Fields(line)[0]] = true
	}
	count := func(re string) int {
		n := 0
		for _, line := range happened {
			if regexp.MustCompile(re).MatchString(line) {
				n++
			}
		}
		return n
	}
	e := exampletest.Expect{Summary: summary}
	e.Total("messages published", len(published))
	e.Part("messages published", "first messages of an order", len(orders))
	e.Part("messages published", "more for an order", len(published)-len(orders))
	e.Total("deliveries", len(happened))
	e.Part("deliveries", "messages", len(published))
	e.Part("deliveries", "delivered again after a nack", count(`failed .*nacked`))
	e.Total("deliveries by outcome", len(happened))
	e.Part("deliveries by outcome", "processed", count(`m\d\d +(delivered again and )?processed`))
	e.Part("deliveries by outcome", "dropped duplicates", count(`dropped duplicate`))
	e.Part("deliveries by outcome", "failed", count(`failed`))
	e.Total("charges", 6)
	e.Part("charges", "orders charged", len(orders))
	e.Part("charges", "charges of an order charged before", 0)
	if err := e.Err(); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}

	for _, re := range []string{
		`o-5 +m07 +failed \(payment gateway timeout\): lease released`,
		`o-5 +m07 +delivered again and processed \(attempt 2\)`,
		`o-6 +m0[89] +processed`,
		`o-6 +m0[89] +waited \d+ms for the copy in progress, then dropped duplicate`,
		`o-2 +m0[24] +dropped duplicate: already processed`,
		`Charges per order: o-1×1 o-2×1 o-3×1 o-4×1 o-5×1 o-6×1\n`,
		`dropped duplicates, the handler not run \(1 after waiting for the copy in progress\)`,
	} {
		if !regexp.MustCompile(re).Match(out.Bytes()) {
			t.Errorf("output does not match %q:\n%s", re, out.String())
		}
	}
}

// section returns the indented lines under heading.
func section(out, heading string) []string {
	var lines []string
	in := false
	for _, line := range strings.Split(out, "\n") {
		switch {
		case line == heading:
			in = true
		case in && strings.HasPrefix(line, "  "):
			lines = append(lines, strings.TrimSpace(line))
		case in:
			return lines
		}
	}
	return lines
}

// The check behind the printed verdict fails on what it must catch.
func TestSummaryCheckCatchesFailures(t *testing.T) {
	good := func() Summary {
		return Summary{
			Published: 3, Orders: 2, Repeats: 1, Deliveries: 3, Acked: 3,
			Outcomes:        map[idempotency.Outcome]int{idempotency.OutcomeProcessed: 2, idempotency.OutcomeDuplicate: 1},
			ChargesPerOrder: map[string]int{"o-1": 1, "o-2": 1},
		}
	}
	if err := good().check(); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]func(s *Summary){
		"an order charged twice":        func(s *Summary) { s.ChargesPerOrder["o-1"] = 2 },
		"an order never charged":        func(s *Summary) { delete(s.ChargesPerOrder, "o-2") },
		"a message never settled":       func(s *Summary) { s.Acked, s.Deliveries, s.Outcomes[idempotency.OutcomeDuplicate] = 2, 2, 0 },
		"a delivery not counted":        func(s *Summary) { s.Deliveries = 4 },
		"a message counted twice":       func(s *Summary) { s.Published = 4 },
		"a nack never delivered again":  func(s *Summary) { s.Nacked = 1 },
		"an unexpected outcome":         func(s *Summary) { s.UnexpectedOutcomeByEvent = []string{"lease_lost for m1"} },
		"a processed delivery too many": func(s *Summary) { s.Outcomes[idempotency.OutcomeProcessed] = 3 },
	} {
		s := good()
		bad(&s)
		if s.check() == nil {
			t.Errorf("%s: the check passed", name)
		}
	}
}
