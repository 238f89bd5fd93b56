package main

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/watermill-idempotency/idempotency/backends"
)

// recordView is a record as idem prints it. Times are the store's; the
// durations left are computed with this machine's clock.
type recordView struct {
	Key string `json:"key"`
	// KeyBase64 is set when the key is not valid UTF-8, which JSON cannot
	// carry exactly.
	KeyBase64 string `json:"key_base64,omitempty"`
	State     string `json:"state"`
	Owner     string `json:"owner"`
	// Origin names what acquired the current or last lease (the
	// middleware: "message_uuid=<uuid> handler=<name>"): for a completed
	// record, which delivery completed it.
	Origin  string `json:"origin,omitempty"`
	Token   int64  `json:"token"`
	Attempt int    `json:"attempt"`
	// AcquiredAt is when the current or last lease was acquired; absent
	// for a record written before stores kept it.
	AcquiredAt     *time.Time `json:"acquired_at,omitempty"`
	LeaseExpiresAt time.Time  `json:"lease_expires_at"`
	LeaseLeft      *float64   `json:"lease_left_seconds,omitempty"`
	CompletedAt    *time.Time `json:"completed_at,omitempty"`
	ForgetAt       time.Time  `json:"forget_at"`
	ForgetIn       float64    `json:"forget_in_seconds"`
	Fingerprint    string     `json:"fingerprint,omitempty"`
	// What a completed record stores for its duplicates, by who wrote
	// it (its origin): OutputKind is "messages" (a Watermill handler's
	// produced messages, listed in Output), "http_response" (httpidem's
	// stored response, whose status is HTTPStatus) or "result" (what a
	// function run with Do returned, encoded by its codec).
	OutputKind  string       `json:"output_kind,omitempty"`
	OutputBytes int          `json:"output_bytes,omitempty"`
	Output      []outputView `json:"output,omitempty"`
	HTTPStatus  int          `json:"http_status,omitempty"`
	OutputError string       `json:"output_error,omitempty"`
}

// The kinds of stored output (recordView.OutputKind).
const (
	outputMessages = "messages"
	outputHTTP     = "http_response"
	outputResult   = "result"
)

// outputView is one stored output message: what a duplicate replays.
type outputView struct {
	UUID         string            `json:"uuid"`
	Metadata     map[string]string `json:"metadata,omitempty"`
	PayloadBytes int               `json:"payload_bytes"`
}

func viewRecord(r backends.Record, now time.Time) recordView {
	v := recordView{
		Key: r.Key, State: r.State.String(), Owner: r.Owner, Origin: r.Origin, Token: r.Token, Attempt: r.Attempt,
		LeaseExpiresAt: r.LeaseExpiresAt, ForgetAt: r.ExpiresAt,
		ForgetIn: seconds(r.ExpiresAt.Sub(now)),
	}
	if !r.AcquiredAt.IsZero() {
		v.AcquiredAt = &r.AcquiredAt
	}
	if !utf8.ValidString(r.Key) {
		v.KeyBase64 = base64.StdEncoding.EncodeToString([]byte(r.Key))
	}
	if r.State == backends.StateInProgress {
		left := seconds(r.LeaseExpiresAt.Sub(now))
		v.LeaseLeft = &left
	}
	if !r.CompletedAt.IsZero() {
		v.CompletedAt = &r.CompletedAt
	}
	if len(r.Fingerprint) > 0 {
		v.Fingerprint = hex.EncodeToString(r.Fingerprint)
	}
	if len(r.Output) > 0 {
		viewOutput(&v, r.Origin, r.Output)
	}
	return v
}

// viewOutput describes output, stored by what origin names: httpidem
// names its requests "http=<route>", the middleware its messages
// "message_uuid=<uuid> ..." (0.1 named none), and Do its calls "do" or
// what DoOptions.Origin says.
func viewOutput(v *recordView, origin string, output []byte) {
	v.OutputBytes = len(output)
	switch {
	case strings.HasPrefix(origin, "http="):
		v.OutputKind = outputHTTP
		// httpidem's stored response starts with its format's version,
		// 1, and the status as a uvarint.
		status, n := binary.Uvarint(output[1:])
		if output[0] != 1 || n <= 0 || status < 100 || status > 999 {
			v.OutputError = "not a stored HTTP response"
			return
		}
		v.HTTPStatus = int(status)
	case origin == "" || strings.HasPrefix(origin, "message_uuid="):
		v.OutputKind = outputMessages
		msgs, err := backends.DecodeOutput(output)
		if err != nil {
			v.OutputError = err.Error()
		}
		for _, m := range msgs {
			v.Output = append(v.Output, outputView{UUID: m.UUID, Metadata: m.Metadata, PayloadBytes: len(m.Payload)})
		}
	default:
		v.OutputKind = outputResult
	}
}

func seconds(d time.Duration) float64 { return max(0, d.Round(time.Millisecond).Seconds()) }

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// printRecord prints one record, field by field.
func printRecord(w io.Writer, v recordView) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, args...)) }
	row("key", "%q", v.Key)
	row("state", "%s", v.State)
	row("owner", "%s", v.Owner)
	if v.Origin != "" {
		row("origin", "%s", v.Origin)
	}
	row("token", "%d", v.Token)
	row("attempt", "%d", v.Attempt)
	if v.AcquiredAt != nil {
		row("acquired", "at %s, %s ago", stamp(*v.AcquiredAt), ago(*v.AcquiredAt))
	}
	switch {
	case v.LeaseLeft != nil:
		row("lease", "expires at %s, in %.3fs", stamp(v.LeaseExpiresAt), *v.LeaseLeft)
	case v.State == backends.StateExpired.String():
		row("lease", "expired at %s: the next delivery takes over", stamp(v.LeaseExpiresAt))
	}
	if v.CompletedAt != nil {
		row("completed", "%s", stamp(*v.CompletedAt))
	}
	row("forgotten", "at %s, in %s", stamp(v.ForgetAt), time.Duration(v.ForgetIn*float64(time.Second)).Round(time.Second))
	if v.Fingerprint != "" {
		row("fingerprint", "%s", v.Fingerprint)
	}
	switch {
	case v.OutputError != "":
		row("output", "unreadable: %s (%d bytes)", v.OutputError, v.OutputBytes)
	case v.OutputKind == outputHTTP:
		row("output", "stored HTTP response: status %d, %d bytes", v.HTTPStatus, v.OutputBytes)
	case v.OutputKind == outputResult:
		row("output", "stored result: %d bytes", v.OutputBytes)
	}
	for i, o := range v.Output {
		row(fmt.Sprintf("output[%d]", i), "uuid %s, %d payload bytes, metadata %s", o.UUID, o.PayloadBytes, metadataString(o.Metadata))
	}
	tw.Flush()
}

func metadataString(md map[string]string) string {
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%q", k, md[k])
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// ago is how long before this machine's now t was, to the millisecond
// under a minute and to the second above.
func ago(t time.Time) time.Duration {
	d := max(0, time.Since(t))
	if d < time.Minute {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}

// printRecords prints records as a table, one per line; the origin,
// the longest, last.
func printRecords(w io.Writer, views []recordView) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATE\tTOKEN\tATTEMPT\tOWNER\tACQUIRED\tLEASE LEFT\tFORGOTTEN IN\tORIGIN")
	for _, v := range views {
		left, acquired, origin := "-", "-", "-"
		if v.LeaseLeft != nil {
			left = fmt.Sprintf("%.1fs", *v.LeaseLeft)
		}
		if v.AcquiredAt != nil {
			acquired = ago(*v.AcquiredAt).Round(100*time.Millisecond).String() + " ago"
		}
		if v.Origin != "" {
			origin = v.Origin
		}
		fmt.Fprintf(tw, "%q\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", v.Key, v.State, v.Token, v.Attempt, v.Owner, acquired, left,
			time.Duration(v.ForgetIn*float64(time.Second)).Round(time.Second), origin)
	}
	tw.Flush()
}
