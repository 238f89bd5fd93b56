package docs

// snippet:counters
import idempotency "github.com/watermill-idempotency/idempotency/middleware"

// end snippet

var _ = counters

func counters(cfg *idempotency.Config) map[string]int64 {
	// snippet:counters
	counters := &idempotency.Counters{}
	cfg.Observer = counters
	// later
	counters.Count(idempotency.OutcomeDuplicate)
	counters.Snapshot() // map[string]int64 by outcome name, for a metrics exporter
	// end snippet
	return counters.Snapshot()
}
