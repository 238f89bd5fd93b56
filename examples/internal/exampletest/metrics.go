package exampletest

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// MetricsURL is the line every example prints once its /metrics endpoint
// listens; its first submatch is the URL.
var MetricsURL = regexp.MustCompile(`msg="serving /metrics" url=(http://\S+/metrics)`)

// Scrape fetches url as Prometheus would and returns its metric families
// by name. It fails the test if that fails.
func Scrape(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	families, err := scrape(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	return families
}

func scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
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

// Sum adds up a counter's samples, or a histogram's counts, by the value
// of label ("" for every sample together); a missing family gives an
// empty map.
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
