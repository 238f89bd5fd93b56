package httpidem

import (
	"encoding/json"
	"net/http"
	"time"
)

// problem answers with an application/problem+json body (RFC 9457) and,
// if retry is positive, a Retry-After header.
func (m *Middleware) problem(w http.ResponseWriter, status int, detail string, retry time.Duration) {
	body, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{m.cfg.ProblemType, http.StatusText(status), status, detail})
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if retry > 0 {
		h.Set("Retry-After", retryAfter(retry))
	}
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
