package main

import (
	"bytes"
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/watermill-idempotency/idempotency/examples/internal/exampletest"
)

func TestQuickstart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	sum, err := run(ctx, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	want := Summary{Sent: 9, Orders: 6, Charged: 6, Processed: 6, Duplicates: 3, DuplicatesAfterWaiting: 1, FailedAttempts: 1, Retried: 1}
	sum.ChargesPerOrder, want.ChargesPerOrder = nil, nil
	if sum.Sent != want.Sent || sum.Orders != want.Orders || sum.Charged != want.Charged || sum.Processed != want.Processed ||
		sum.Duplicates != want.Duplicates || sum.DuplicatesAfterWaiting != want.DuplicatesAfterWaiting ||
		sum.FailedAttempts != want.FailedAttempts || sum.Retried != want.Retried {
		t.Fatalf("summary %+v, want %+v\n%s", sum, want, out.String())
	}
	if err := exampletest.EndsWithVerdict(out.String(), "Check: 6 orders charged once each"); err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{
		`o-5 +m07 +failed \(payment gateway timeout\): lease released`,
		`o-5 +m07 +retried and processed \(attempt 2\)`,
		`o-6 +m0[89] +waited \d+ms for the copy in progress, then dropped duplicate`,
		`o-2 +m0[24] +dropped duplicate: already processed`,
		`Summary: 9 messages for 6 orders: 6 processed \(1 after a retry\), 3 dropped duplicates \(1 after waiting\), 1 failed attempt retried\.`,
		`Charges per order: o-1×1 o-2×1 o-3×1 o-4×1 o-5×1 o-6×1\n`,
		`Check: 6 orders charged once each, 9 messages settled, none lost\.`,
	} {
		if !regexp.MustCompile(re).Match(out.Bytes()) {
			t.Errorf("output does not match %q:\n%s", re, out.String())
		}
	}
}

// The check behind the printed verdict fails on what it must catch.
func TestSummaryCheckCatchesFailures(t *testing.T) {
	good := Summary{Sent: 3, Orders: 2, Charged: 2, Processed: 2, Duplicates: 1, ChargesPerOrder: map[string]int{"o-1": 1, "o-2": 1}}
	if err := good.check(); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]func(s *Summary){
		"an order charged twice":  func(s *Summary) { s.Charged, s.ChargesPerOrder["o-1"] = 3, 2 },
		"a message never settled": func(s *Summary) { s.Duplicates = 0 },
		"an unexpected outcome":   func(s *Summary) { s.UnexpectedOutcomeByEvent = []string{"lease_lost for m1"} },
	} {
		s := good
		s.ChargesPerOrder = map[string]int{"o-1": 1, "o-2": 1}
		bad(&s)
		if s.check() == nil {
			t.Errorf("%s: the check passed", name)
		}
	}
}
