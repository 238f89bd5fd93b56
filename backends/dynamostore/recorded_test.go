package dynamostore_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/dynamostore"
)

// The files under testdata/ are HTTP responses in DynamoDB's wire format
// (the JSON 1.0 protocol: status, x-amzn-RequestId, x-amz-crc32, a
// "__type" naming the error), one per file, as http.ReadResponse reads
// them. Their times are Unix ms around recordedAt, the time the stores
// under test are given, with the default ClockSkew of 1 s and a retention
// of 24 h. They cover what dynalite cannot answer: a failed condition with
// the item (ReturnValuesOnConditionCheckFailure=ALL_OLD) and
// UpdateTimeToLive.
var recordedAt = time.UnixMilli(1741944413589) // 2025-03-14T09:26:53.589Z

// exchange is one request a replay expects and the response it gives.
type exchange struct {
	op   string // the operation, from X-Amz-Target
	file string // the response, under testdata/
	// check, if not nil, inspects the request's JSON body.
	check func(t *testing.T, body map[string]any)
}

// replay is a transport that answers the SDK with recorded responses, in
// order, and fails the test on a request it does not expect: a store that
// sends one more call than the exchanges list (a GetItem after a failed
// condition, say) is caught.
type replay struct {
	t    *testing.T
	mu   sync.Mutex
	next []exchange
}

// errUnexpected answers an unexpected request.
var errUnexpected = errors.New("replay: unexpected request")

// newReplay returns a replay of exchanges that checks, when the test
// ends, that each was asked for.
func newReplay(t *testing.T, exchanges ...exchange) *replay {
	r := &replay{t: t, next: exchanges}
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, e := range r.next {
			t.Errorf("replay: no %s request for %s", e.op, e.file)
		}
	})
	return r
}

func (r *replay) RoundTrip(req *http.Request) (*http.Response, error) {
	op := strings.TrimPrefix(req.Header.Get(target), "DynamoDB_20120810.")
	raw, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.next) == 0 || r.next[0].op != op {
		want := "none"
		if len(r.next) > 0 {
			want = r.next[0].op
		}
		r.t.Errorf("replay: unexpected %s request (expected: %s): %s", op, want, raw)
		return nil, fmt.Errorf("%w: %s", errUnexpected, op)
	}
	e := r.next[0]
	r.next = r.next[1:]
	if e.check != nil {
		var body map[string]any
		require.NoError(r.t, json.Unmarshal(raw, &body), "the %s request's body", op)
		e.check(r.t, body)
	}
	return recorded(r.t, e.file, req)
}

// recorded reads a response from testdata/, checking that the file holds
// exactly one response of the length it declares.
func recorded(t *testing.T, file string, req *http.Request) (*http.Response, error) {
	raw, err := os.ReadFile(filepath.Join("testdata", file))
	require.NoError(t, err)
	br := bufio.NewReader(bytes.NewReader(raw))
	resp, err := http.ReadResponse(br, req)
	require.NoError(t, err, file)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err, file)
	rest, _ := io.ReadAll(br)
	require.Empty(t, strings.TrimSpace(string(rest)), "%s: bytes past Content-Length", file)
	require.Equal(t, "application/x-amz-json-1.0", resp.Header.Get("Content-Type"), file)
	require.NotEmpty(t, resp.Header.Get("X-Amzn-Requestid"), file)
	// The SDK checks the CRC32 of successful responses only.
	require.Equal(t, strconv.FormatUint(uint64(crc32.ChecksumIEEE(body)), 10), resp.Header.Get("X-Amz-Crc32"), "%s: the body's CRC32", file)
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, nil
}

// replayStore returns a store on the default table whose client talks to
// r only, with its clock stopped at recordedAt.
func replayStore(t *testing.T, r *replay) *dynamostore.Store {
	t.Helper()
	return replayStoreWith(t, r, dynamostore.Options{})
}

// replayStoreWith is replayStore with opts.
func replayStoreWith(t *testing.T, r *replay, opts dynamostore.Options) *dynamostore.Store {
	t.Helper()
	api := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String("https://dynamodb.us-east-1.amazonaws.com"),
		Credentials:  staticCredentials,
		HTTPClient:   &http.Client{Transport: r},
		// A retry would be a request the replay does not expect.
		RetryMaxAttempts: 1,
	})
	s, err := dynamostore.New(api, opts)
	require.NoError(t, err)
	dynamostore.SetClock(s, func() time.Time { return recordedAt })
	return s
}

// acquireWrite checks that a request is the first write of an Acquire of
// key: the new-record case, asking for the item on failure.
func acquireWrite(key string) func(t *testing.T, body map[string]any) {
	return func(t *testing.T, body map[string]any) {
		require.Equal(t, dynamostore.DefaultTable, body["TableName"])
		require.Equal(t, map[string]any{"id": map[string]any{"B": base64.StdEncoding.EncodeToString([]byte(key))}}, body["Key"])
		require.Equal(t, "ALL_OLD", body["ReturnValuesOnConditionCheckFailure"])
		require.Contains(t, body["ConditionExpression"], "attribute_not_exists(#id)")
	}
}

// A duplicate is answered from the item DynamoDB returns with the failed
// condition, in one request: no GetItem follows.
func TestRecordedAllOldDuplicate(t *testing.T) {
	t.Parallel()
	const retention = 24 * time.Hour
	t.Run("in progress", func(t *testing.T) {
		t.Parallel()
		s := replayStore(t, newReplay(t,
			exchange{op: "UpdateItem", file: "update_item_in_progress.http", check: acquireWrite("order-1001")}))
		res, err := s.Acquire(ctx(t), backends.AcquireRequest{
			Key: "order-1001", Owner: "consumer-b", LeaseTTL: 30 * time.Second, Retention: retention,
			Fingerprint: []byte("sha256:9f2c1e"),
		})
		require.NoError(t, err)
		require.Equal(t, backends.StatusInProgress, res.Status)
		require.Equal(t, 21*time.Second, res.Remaining, "the holder's 20 s, plus the 1 s margin")
		require.Equal(t, []byte("sha256:9f2c1e"), res.Fingerprint)
	})
	t.Run("completed", func(t *testing.T) {
		t.Parallel()
		s := replayStore(t, newReplay(t,
			exchange{op: "UpdateItem", file: "update_item_completed.http", check: acquireWrite("order-1002")}))
		res, err := s.Acquire(ctx(t), backends.AcquireRequest{
			Key: "order-1002", Owner: "consumer-b", LeaseTTL: 30 * time.Second, Retention: retention,
			Fingerprint: []byte("sha256:4b7d0a"),
		})
		require.NoError(t, err)
		require.Equal(t, backends.StatusCompleted, res.Status)
		require.True(t, recordedAt.Add(-5*time.Second).Equal(res.CompletedAt), "completed at %v", res.CompletedAt)
		require.Equal(t, []byte(`{"order_id":"1002","status":"shipped"}`), res.Output)
		require.Equal(t, []byte("sha256:4b7d0a"), res.Fingerprint)
	})
}

// The caller's own lease, learnt from the failed condition, is extended by
// a second write conditional on the owner: two UpdateItems and no read.
func TestRecordedAllOldReentrant(t *testing.T) {
	t.Parallel()
	s := replayStore(t, newReplay(t,
		exchange{op: "UpdateItem", file: "update_item_own_lease.http", check: acquireWrite("order-1003")},
		exchange{op: "UpdateItem", file: "update_item_reentrant.http", check: func(t *testing.T, body map[string]any) {
			require.Contains(t, body["ConditionExpression"], "#owner = :owner")
			require.Equal(t, map[string]any{"S": "consumer-a"}, body["ExpressionAttributeValues"].(map[string]any)[":owner"])
			require.Equal(t, "ALL_NEW", body["ReturnValues"])
		}},
	))
	res, err := s.Acquire(ctx(t), backends.AcquireRequest{Key: "order-1003", Owner: "consumer-a", LeaseTTL: 30 * time.Second, Retention: 24 * time.Hour})
	require.NoError(t, err)
	require.Equal(t, backends.StatusAcquired, res.Status)
	require.True(t, res.Reentrant)
	require.Equal(t, int64(5), res.Lease.Token, "the same token")
	require.Equal(t, 1, res.Lease.Attempt)
}

// Migrate turns on Time to Live on the ttl attribute, accepts a table
// where it is already on, and refuses one where it is on another
// attribute: the store's ttl would never be read there. With
// TTLUntouched it leaves TTL alone.
func TestRecordedMigrateTTL(t *testing.T) {
	t.Parallel()
	wantTTL := func(t *testing.T, body map[string]any) {
		require.Equal(t, map[string]any{
			"TableName":               dynamostore.DefaultTable,
			"TimeToLiveSpecification": map[string]any{"AttributeName": "ttl", "Enabled": true},
		}, body)
	}
	wantTable := func(t *testing.T, body map[string]any) {
		require.Equal(t, dynamostore.DefaultTable, body["TableName"])
		require.Equal(t, "PAY_PER_REQUEST", body["BillingMode"])
		require.Equal(t, []any{map[string]any{"AttributeName": "id", "AttributeType": "B"}}, body["AttributeDefinitions"])
		require.Equal(t, []any{map[string]any{"AttributeName": "id", "KeyType": "HASH"}}, body["KeySchema"])
	}
	exists := []exchange{
		{op: "CreateTable", file: "create_table_exists.http", check: wantTable},
		{op: "DescribeTable", file: "describe_table_active.http"},
	}
	for _, tc := range []struct {
		name      string
		ttl       dynamostore.TTL
		exchanges []exchange
		err       error
	}{
		{"new table", dynamostore.TTLOn, []exchange{
			{op: "CreateTable", file: "create_table.http", check: wantTable},
			{op: "DescribeTable", file: "describe_table_creating.http"},
			{op: "DescribeTable", file: "describe_table_active.http"},
			{op: "UpdateTimeToLive", file: "update_time_to_live.http", check: wantTTL},
		}, nil},
		{"TTL already on", dynamostore.TTLOn,
			append(exists[:2:2], exchange{op: "UpdateTimeToLive", file: "update_time_to_live_enabled.http", check: wantTTL}), nil},
		{"TTL on another attribute", dynamostore.TTLOn,
			append(exists[:2:2], exchange{op: "UpdateTimeToLive", file: "update_time_to_live_other.http", check: wantTTL}), backends.ErrRejected},
		{"TTLUntouched", dynamostore.TTLUntouched, exists, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := replayStoreWith(t, newReplay(t, tc.exchanges...), dynamostore.Options{TTL: tc.ttl})
			err := s.Migrate(context.Background())
			if tc.err == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.err)
			require.ErrorContains(t, err, "different AttributeName")
		})
	}
}
