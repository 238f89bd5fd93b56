package idemotel

import (
	"slices"

	"go.opentelemetry.io/otel/propagation"
)

// PropagationKeys returns the metadata keys propagator writes (its
// Fields), for middleware.Config.ReplayDropMetadata. A nil propagator
// means W3C Trace Context and Baggage: traceparent, tracestate and
// baggage. Pass otel.GetTextMapPropagator() to match the application's.
// The keys are sorted.
func PropagationKeys(propagator propagation.TextMapPropagator) []string {
	if propagator == nil {
		propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	keys := slices.Clone(propagator.Fields())
	slices.Sort(keys)
	return slices.Compact(keys)
}
