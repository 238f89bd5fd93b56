// Package metrics gives the examples a Prometheus /metrics endpoint: the
// idempotency middleware's OpenTelemetry metrics, through OpenTelemetry's
// Prometheus exporter, next to Watermill's own router metrics, on one
// registry.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/metrics"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/watermill-idempotency/idempotency/backends"
	idemotel "github.com/watermill-idempotency/idempotency/contrib/otel"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// Server serves /metrics until it is closed.
type Server struct {
	// URL is the endpoint to scrape.
	URL string
	// Meters records to the endpoint's registry.
	Meters *sdkmetric.MeterProvider

	registry *prometheus.Registry
	srv      *http.Server
}

// Serve listens on addr (empty or "127.0.0.1:0" picks a free port) and
// serves /metrics there.
func Serve(addr string) (*Server, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics endpoint: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	s := &Server{
		URL:      "http://" + ln.Addr().String() + "/metrics",
		Meters:   sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter)),
		registry: registry,
		srv:      &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second},
	}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Instrument wires the idempotency middleware to the endpoint, as
// docs/operations.md shows: it returns store wrapped by
// idemotel.InstrumentStore and an idemotel observer, both recording here.
func (s *Server) Instrument(store backends.Store) (backends.Store, idempotency.Observer, error) {
	observer, err := idemotel.NewObserver(idemotel.Config{MeterProvider: s.Meters})
	if err != nil {
		return nil, nil, err
	}
	instrumented, err := idemotel.InstrumentStore(store, idemotel.StoreConfig{MeterProvider: s.Meters})
	if err != nil {
		return nil, nil, err
	}
	return instrumented, observer, nil
}

// AddRouterMetrics adds Watermill's Prometheus metrics for r (handler
// execution times, messages published and received) to the endpoint.
func (s *Server) AddRouterMetrics(r *message.Router) {
	metrics.NewPrometheusMetricsBuilder(s.registry, "", "").AddPrometheusRouterMetrics(r)
}

// Close stops serving.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return errors.Join(s.srv.Shutdown(ctx), s.Meters.Shutdown(ctx))
}

// Scrape fetches the endpoint as Prometheus would and returns its metric
// families by name.
func Scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(resp.Body)
}

// Sum adds up a counter's or a histogram's samples (the histogram's counts)
// by the value of label; a missing family gives an empty map.
func Sum(families map[string]*dto.MetricFamily, family, label string) map[string]float64 {
	out := map[string]float64{}
	f, ok := families[family]
	if !ok {
		return out
	}
	for _, m := range f.GetMetric() {
		value := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				value = l.GetValue()
			}
		}
		switch {
		case m.GetCounter() != nil:
			out[value] += m.GetCounter().GetValue()
		case m.GetHistogram() != nil:
			out[value] += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return out
}

// Metric families and labels, as the Prometheus exporter names them.
const (
	// Deliveries is watermill.idempotency.deliveries.
	Deliveries = "watermill_idempotency_deliveries_total"
	// OutcomeLabel is the outcome attribute.
	OutcomeLabel = "watermill_idempotency_outcome"
	// HandlerExecutions is Watermill's router metric of handler runs.
	HandlerExecutions = "handler_execution_time_seconds"
)

// Scraped is what an example's /metrics said.
type Scraped struct {
	// Deliveries counts the middleware's deliveries by outcome.
	Deliveries map[string]float64
	// HandlerExecutions counts the handler runs Watermill's router
	// metrics saw (every delivery, whatever the middleware made of it).
	HandlerExecutions float64
}

// Scrape fetches the endpoint, as Prometheus would, and reads it.
func (s *Server) Scrape(ctx context.Context) (Scraped, error) {
	families, err := Scrape(ctx, s.URL)
	if err != nil {
		return Scraped{}, err
	}
	return Scraped{
		Deliveries:        Sum(families, Deliveries, OutcomeLabel),
		HandlerExecutions: Sum(families, HandlerExecutions, "")[""],
	}, nil
}

// Check reports how the scrape differs from the counts an example's own
// observer made, by outcome, and whether the router metrics saw at least
// every published message; nil if they agree.
func (s Scraped) Check(want map[string]int64, published int) error {
	var errs []error
	for outcome, n := range want {
		if s.Deliveries[outcome] != float64(n) {
			errs = append(errs, fmt.Errorf("/metrics says %v %s deliveries, the run saw %d", s.Deliveries[outcome], outcome, n))
		}
	}
	if s.HandlerExecutions < float64(published) {
		errs = append(errs, fmt.Errorf("/metrics counted %v handler executions for %d messages", s.HandlerExecutions, published))
	}
	return errors.Join(errs...)
}

// String describes the scrape in one line.
func (s Scraped) String() string {
	keys := make([]string, 0, len(s.Deliveries))
	for k := range s.Deliveries {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%v", k, s.Deliveries[k])
	}
	return fmt.Sprintf("%s by outcome: %s; Watermill's %s: %v", Deliveries, strings.Join(parts, ", "), HandlerExecutions, s.HandlerExecutions)
}
