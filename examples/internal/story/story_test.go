package story

import (
	"testing"
	"time"
)

// The check behind every broker's verdict fails on what it must catch.
func TestReportCheckCatchesFailures(t *testing.T) {
	good := func() Report {
		return Report{Orders: 4, Applied: map[string]int{SlowOrder: 1, FlakyOrder: 1, OutageOrder: 1, CrashOrder: 1},
			Outcomes: map[string]int64{"handler_failed": 1, "store_error": 1, "in_progress": 1}, SlowDeliveries: 3, SlowInFlight: 1, SlowRedelivered: 1,
			StoreCallsWhileSlow: 10, SlowRun: 2 * time.Second, RedeliversWhileRunning: true,
			CrashedConsumer: "consumer-a", CrashTakeover: true, CrashRecovery: 5 * time.Second}
	}
	if err := good().Check(); err != nil {
		t.Fatal(err)
	}
	serialized := good()
	serialized.SlowInFlight, serialized.Serialized, serialized.RedeliversWhileRunning = 0, true, false
	delete(serialized.Outcomes, "in_progress")
	if err := serialized.Check(); err != nil {
		t.Errorf("a serialized broker has no in-flight duplicate to show: %v", err)
	}
	for name, bad := range map[string]func(r *Report){
		"an order charged twice":          func(r *Report) { r.Applied[SlowOrder] = 2 },
		"an order lost":                   func(r *Report) { delete(r.Applied, SlowOrder) },
		"the flaky order never failed":    func(r *Report) { delete(r.Outcomes, "handler_failed") },
		"an in-flight duplicate acked":    func(r *Report) { r.AckedEarly = []string{"charge:" + SlowOrder} },
		"a hot loop":                      func(r *Report) { r.StoreCallsWhileSlow = 1000 },
		"no duplicate while the slow ran": func(r *Report) { r.SlowInFlight = 0 },
		"no redelivery by the broker":     func(r *Report) { r.SlowRedelivered = 0 },
		"no in-flight duplicate nacked":   func(r *Report) { delete(r.Outcomes, "in_progress") },
		"the crash order never charged":   func(r *Report) { delete(r.Applied, CrashOrder) },
		"no takeover after the crash":     func(r *Report) { r.CrashTakeover = false },
	} {
		r := good()
		bad(&r)
		if r.Check() == nil {
			t.Errorf("%s: the check passed", name)
		}
	}
}
