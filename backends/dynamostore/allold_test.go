package dynamostore_test

import (
	"bytes"
	"encoding/json"
	"hash/crc32"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
)

// allOld is a transport that makes dynalite answer a failed condition as
// DynamoDB does when asked for ReturnValuesOnConditionCheckFailure=ALL_OLD:
// with the item the condition was checked against. It reads the item with
// a request of its own right after the failure, so the answer is the
// record as it was at some moment during the call, which is all the store
// may assume.
type allOld struct {
	url      string
	injected atomic.Int64 // failures answered with an item
	reads    atomic.Int64 // GetItem requests from the store
	writes   atomic.Int64 // UpdateItem requests from the store
	off      bool         // pass failures through as dynalite sends them
}

func newAllOld(url string) *allOld { return &allOld{url: url} }

const target = "X-Amz-Target"

func (a *allOld) RoundTrip(req *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	op := strings.TrimPrefix(req.Header.Get(target), "DynamoDB_20120810.")
	switch op {
	case "GetItem":
		a.reads.Add(1)
	case "UpdateItem":
		a.writes.Add(1)
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || op != "UpdateItem" {
		return resp, err
	}
	var in struct {
		TableName                           string
		Key                                 json.RawMessage
		ReturnValuesOnConditionCheckFailure string
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, err
	}
	if a.off || resp.StatusCode != http.StatusBadRequest || in.ReturnValuesOnConditionCheckFailure != "ALL_OLD" {
		return resp, nil
	}
	errBody, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	var failure map[string]any
	if json.Unmarshal(errBody, &failure) != nil || !strings.HasSuffix(failure["__type"].(string), "#ConditionalCheckFailedException") {
		return a.replace(resp, errBody), nil
	}
	item, err := a.get(req, in.TableName, in.Key)
	if err != nil {
		return nil, err
	}
	if item != nil {
		failure["Item"] = item
		a.injected.Add(1)
	}
	errBody, _ = json.Marshal(failure)
	return a.replace(resp, errBody), nil
}

// replace gives resp a new body, with the checksum DynamoDB sends.
func (a *allOld) replace(resp *http.Response, body []byte) *http.Response {
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	resp.Header.Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(body)), 10))
	return resp
}

// get reads the item with key from table, strongly consistent, with the
// headers of the store's request; nil if there is none.
func (a *allOld) get(orig *http.Request, table string, key json.RawMessage) (json.RawMessage, error) {
	body, _ := json.Marshal(map[string]any{"TableName": table, "Key": key, "ConsistentRead": true})
	req, err := http.NewRequestWithContext(orig.Context(), http.MethodPost, a.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for _, h := range []string{"Authorization", "X-Amz-Date", "Content-Type"} {
		req.Header.Set(h, orig.Header.Get(h))
	}
	req.Header.Set(target, "DynamoDB_20120810.GetItem")
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct{ Item json.RawMessage }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	if len(out.Item) == 0 || string(out.Item) == "null" {
		return nil, nil
	}
	return out.Item, nil
}
