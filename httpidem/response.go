package httpidem

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
)

// response is a handler's response as it is stored and replayed.
type response struct {
	status int
	header http.Header
	body   []byte
}

// write sends r to the client, marked as replayed if it is. A key
// completed without a stored response (by an operator's `idem complete`)
// replays as 200 OK with no body.
func (r *response) write(w http.ResponseWriter, replayed bool) {
	status := http.StatusOK
	if r != nil {
		status = r.status
		for k, v := range r.header {
			w.Header()[k] = slices.Clone(v)
		}
	}
	if replayed {
		w.Header().Set(ReplayedHeader, "true")
	}
	w.WriteHeader(status)
	if r != nil && len(r.body) > 0 {
		_, _ = w.Write(r.body)
	}
}

// recorder is the http.ResponseWriter the handler writes to: it keeps the
// response, up to a limit on its body, to be stored and then sent. Past
// the limit it streams: what it kept and everything after goes to the
// client as the handler writes it.
type recorder struct {
	w     http.ResponseWriter // the client's
	limit int

	header    http.Header // the handler's, until WriteHeader
	sent      http.Header // the header as of WriteHeader
	status    int
	body      bytes.Buffer
	streaming bool
}

func newRecorder(w http.ResponseWriter, limit int) *recorder {
	return &recorder{w: w, limit: limit, header: http.Header{}}
}

// Header implements http.ResponseWriter.
func (r *recorder) Header() http.Header {
	if r.streaming {
		return r.w.Header()
	}
	return r.header
}

// WriteHeader implements http.ResponseWriter. Informational statuses
// (1xx) are not recorded.
func (r *recorder) WriteHeader(status int) {
	if r.status != 0 || status < 200 {
		return
	}
	r.status = status
	r.sent = r.header.Clone()
}

// Write implements http.ResponseWriter.
func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if r.streaming {
		return r.w.Write(p)
	}
	if r.body.Len()+len(p) > r.limit {
		r.stream()
		return r.w.Write(p)
	}
	return r.body.Write(p)
}

// Flush implements http.Flusher: it flushes the client's writer once the
// response streams, and does nothing while it is kept.
func (r *recorder) Flush() {
	if r.streaming {
		_ = http.NewResponseController(r.w).Flush()
	}
}

// Unwrap returns the client's writer, for http.ResponseController: its
// deadlines and full duplex apply to the client's connection.
func (r *recorder) Unwrap() http.ResponseWriter { return r.w }

// Hijack implements http.Hijacker to refuse it: a response written on a
// hijacked connection could be neither kept nor replayed.
// http.ResponseController.Hijack asks the recorder, not the writer it
// wraps, and gets an error matching http.ErrNotSupported.
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, fmt.Errorf("httpidem: a request with an Idempotency-Key cannot take over its connection: %w", http.ErrNotSupported)
}

// stream sends what was kept and makes the recorder a pass-through.
func (r *recorder) stream() {
	r.response().write(r.w, false)
	r.body = bytes.Buffer{}
	r.streaming = true
}

// response returns the response as written so far.
func (r *recorder) response() *response {
	resp := &response{status: r.status, header: r.sent, body: r.body.Bytes()}
	if r.status == 0 {
		resp.status, resp.header = http.StatusOK, r.header
	}
	return resp
}

// flush sends the kept response to the client, unless it streamed.
func (r *recorder) flush() {
	if !r.streaming {
		r.response().write(r.w, false)
	}
}

// responseCodec stores a *response: its status, the headers on the
// allowlist and its body.
type responseCodec struct {
	allow map[string]bool // canonical header names
}

func newResponseCodec(names []string) responseCodec {
	c := responseCodec{allow: map[string]bool{}}
	for _, n := range names {
		c.allow[http.CanonicalHeaderKey(n)] = true
	}
	return c
}

// codecVersion starts every stored response.
const codecVersion = 1

// Marshal implements idempotency.Codec for a *response.
func (c responseCodec) Marshal(v any) ([]byte, error) {
	r, ok := v.(*response)
	if !ok || r == nil {
		return nil, fmt.Errorf("httpidem: cannot store a %T", v)
	}
	b := []byte{codecVersion}
	b = binary.AppendUvarint(b, uint64(r.status))
	names := make([]string, 0, len(r.header))
	for k := range r.header {
		if c.allow[k] {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, k := range names {
		b = appendString(b, k)
		b = binary.AppendUvarint(b, uint64(len(r.header[k])))
		for _, v := range r.header[k] {
			b = appendString(b, v)
		}
	}
	return append(b, r.body...), nil
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

var errCorrupt = errors.New("httpidem: a stored response is corrupt")

// Unmarshal implements idempotency.Codec into a **response.
func (c responseCodec) Unmarshal(data []byte, v any) error {
	p, ok := v.(**response)
	if !ok {
		return fmt.Errorf("httpidem: cannot decode into a %T", v)
	}
	if len(data) == 0 || data[0] != codecVersion {
		return errCorrupt
	}
	d := decoder{b: data[1:]}
	r := &response{status: int(d.uvarint()), header: http.Header{}}
	for n := d.uvarint(); n > 0 && d.err == nil; n-- {
		k := d.string()
		count := d.uvarint()
		if count > uint64(len(d.b)) { // every value takes a byte at least
			return errCorrupt
		}
		vals := make([]string, 0, count)
		for ; count > 0 && d.err == nil; count-- {
			vals = append(vals, d.string())
		}
		r.header[k] = vals
	}
	if d.err != nil || r.status < 100 || r.status > 999 {
		return errCorrupt
	}
	r.body = d.b
	*p = r
	return nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errCorrupt
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.err != nil || n > uint64(len(d.b)) {
		d.err = errCorrupt
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// Reset discards the response written so far to w, a writer the
// middleware gave the handler (or one that wraps it, with an Unwrap
// method), and reports whether it could: not once the response streams
// (past Config.MaxResponseBytes), nor for another writer. A handler that
// writes its response inside a database transaction, so that the key is
// completed with it in that transaction (contrib/sqloutbox's WithTx),
// calls it when the transaction fails, before it writes the error
// response:
//
//	if err := outbox.WithTx(r.Context(), fn); err != nil { // fn wrote the 201
//		httpidem.Reset(w)
//		http.Error(w, "try again", http.StatusServiceUnavailable)
//	}
func Reset(w http.ResponseWriter) bool {
	for w != nil {
		if r, ok := w.(*recorder); ok {
			if r.streaming {
				return false
			}
			r.header, r.sent, r.status = http.Header{}, nil, 0
			r.body.Reset()
			return true
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return false
		}
		w = u.Unwrap()
	}
	return false
}
