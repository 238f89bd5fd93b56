package dynamostore_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/dynamostore"
	"github.com/watermill-idempotency/idempotency/storetest"
)

// server is the DynamoDB the tests share, and the client options to reach
// it.
type server struct {
	url string
}

// startServer returns the DynamoDB at $DYNAMODB_ENDPOINT: `make test`
// starts a private dynalite and sets it. A test without it fails.
func startServer(t testing.TB) server {
	t.Helper()
	url := os.Getenv("DYNAMODB_ENDPOINT")
	if url == "" {
		t.Fatal("DYNAMODB_ENDPOINT is not set. Run the tests with `make test`, which starts a private dynalite " +
			"and sets it, or set it to a DynamoDB endpoint the tests may create tables on")
	}
	return server{url: url}
}

// client returns a client of the server, through transport if it is not
// nil.
func (sv server) client(transport http.RoundTripper) *dynamodb.Client {
	opts := dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(sv.url),
		Credentials:  staticCredentials,
	}
	if transport != nil {
		opts.HTTPClient = &http.Client{Transport: transport}
	}
	return dynamodb.New(opts)
}

// staticCredentials sign every request with a fixed key, as emulators
// accept.
var staticCredentials = aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
	return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "test"}, nil
})

var tableSeq atomic.Int64

// newStore returns a store on a table of its own, created with the store's
// own helper and deleted when the test ends. The table's name holds the
// run's id ($IDEM_TEST_RUN) and the process's, as other test processes
// share the server.
func newStore(t testing.TB, api dynamostore.API, opts dynamostore.Options) *dynamostore.Store {
	t.Helper()
	opts.Table = fmt.Sprintf("idem_test_%s_%d_%d", os.Getenv("IDEM_TEST_RUN"), os.Getpid(), tableSeq.Add(1))
	opts.TTL = dynamostore.TTLUntouched // dynalite has no UpdateTimeToLive
	s, err := dynamostore.New(api, opts)
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()))
	deleter, ok := api.(interface {
		DeleteTable(context.Context, *dynamodb.DeleteTableInput, ...func(*dynamodb.Options)) (*dynamodb.DeleteTableOutput, error)
	})
	require.True(t, ok, "newStore needs an API that can delete its table")
	t.Cleanup(func() {
		_, err := deleter.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(opts.Table)})
		require.NoError(t, err)
	})
	return s
}

// clock is a fake clock the tests move by hand.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Now()} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// skew is the margin of the real-clock suites: a fifth of the suite's
// tick.
const skew = 20 * time.Millisecond

// The whole suite on the real clock.
func TestConformance(t *testing.T) {
	t.Parallel()
	sv := startServer(t)
	api := sv.client(nil)
	storetest.Run(t, func(t *testing.T) storetest.Fixture {
		return storetest.Fixture{Store: newStore(t, api, dynamostore.Options{ClockSkew: skew}), Skew: skew}
	})
}

// The whole suite on a clock moved by hand, with the default skew margin:
// the store's judgement of time alone, whatever the scheduler does.
func TestConformanceFakeClock(t *testing.T) {
	t.Parallel()
	sv := startServer(t)
	api := sv.client(nil)
	storetest.Run(t, func(t *testing.T) storetest.Fixture {
		s := newStore(t, api, dynamostore.Options{})
		c := newClock()
		dynamostore.SetClock(s, c.Now)
		return storetest.Fixture{Store: s, Advance: c.Advance, Tick: 10 * time.Second, Skew: dynamostore.DefaultClockSkew}
	})
}

// The whole suite through a server that returns the record with a failed
// condition, as DynamoDB does for ReturnValuesOnConditionCheckFailure
// (dynalite ignores it): the store learns every record from the failure
// and never reads it back.
func TestConformanceAllOld(t *testing.T) {
	t.Parallel()
	sv := startServer(t)
	tr := newAllOld(sv.url)
	api := sv.client(tr)
	t.Run("suite", func(t *testing.T) { // returns once the parallel tests are done
		storetest.Run(t, func(t *testing.T) storetest.Fixture {
			return storetest.Fixture{Store: newStore(t, api, dynamostore.Options{ClockSkew: skew}), Skew: skew}
		})
	})
	require.Positive(t, tr.injected.Load(), "failed conditions answered with the record")
}

// A duplicate of completed work costs one failed write when DynamoDB
// returns the record with the failure, and a strongly consistent read
// more when it does not (dynalite, DynamoDB Local before 2023).
func TestDuplicateCalls(t *testing.T) {
	t.Parallel()
	sv := startServer(t)
	for _, tc := range []struct {
		name          string
		allOld        bool
		writes, reads int64
	}{{"with ALL_OLD", true, 1, 0}, {"without", false, 1, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newAllOld(sv.url)
			tr.off = !tc.allOld
			s := newStore(t, sv.client(tr), dynamostore.Options{})
			l := acquire(t, s, "k", "a", time.Minute).Lease
			require.NoError(t, s.Complete(ctx(t), l, []byte("out")))
			writes, reads := tr.writes.Load(), tr.reads.Load()
			res := acquire(t, s, "k", "b", time.Minute)
			require.Equal(t, backends.StatusCompleted, res.Status)
			require.Equal(t, []byte("out"), res.Output)
			require.Equal(t, tc.writes, tr.writes.Load()-writes, "UpdateItem calls")
			require.Equal(t, tc.reads, tr.reads.Load()-reads, "GetItem calls")
		})
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	api := dynamodb.New(dynamodb.Options{Region: "us-east-1"})
	_, err := dynamostore.New(nil, dynamostore.Options{})
	require.ErrorIs(t, err, backends.ErrNilClient)
	require.EqualError(t, err, "dynamostore: backends: nil client")
	_, err = dynamostore.New((*dynamodb.Client)(nil), dynamostore.Options{})
	require.ErrorIs(t, err, backends.ErrNilClient, "a typed nil client")
	for name, opts := range map[string]dynamostore.Options{
		"short table name": {Table: "ab"},
		"odd table name":   {Table: "idem keys"},
		"skew over limit":  {ClockSkew: dynamostore.MaxClockSkew + 1},
		"unknown TTL":      {TTL: dynamostore.TTLUntouched + 1},
	} {
		_, err := dynamostore.New(api, opts)
		require.ErrorIs(t, err, backends.ErrInvalidOptions, name)
	}
	s, err := dynamostore.New(api, dynamostore.Options{})
	require.NoError(t, err)
	require.Equal(t, dynamostore.Options{Table: dynamostore.DefaultTable, ClockSkew: dynamostore.DefaultClockSkew}, s.Options())
	s, err = dynamostore.New(api, dynamostore.Options{ClockSkew: -1})
	require.NoError(t, err)
	require.Negative(t, s.Options().ClockSkew, "negative: none, and kept so, so that the options make the same store again")
}

// ctx is the tests' context: it ends with the test.
func ctx(t testing.TB) context.Context { return t.Context() }

// acquire asks s for key on behalf of owner, with a lease of ttl and an
// hour's retention, and fails the test on an error.
func acquire(t testing.TB, s backends.Store, key, owner string, ttl time.Duration) backends.AcquireResult {
	t.Helper()
	res, err := s.Acquire(t.Context(), backends.AcquireRequest{Key: key, Owner: owner, LeaseTTL: ttl, Retention: time.Hour})
	require.NoError(t, err, "acquire %q", key)
	return res
}

// Two processes whose clocks are 900 ms apart share a table with the
// default skew margin of 1 s: the one whose clock runs ahead never takes
// over a lease the holder still counts as its own. Without the margin it
// does, 900 ms early.
func TestClockSkewMargin(t *testing.T) {
	t.Parallel()
	sv := startServer(t)
	api := sv.client(nil)
	for _, tc := range []struct {
		name      string
		skew      time.Duration
		takenOver bool
	}{{"margin", 0, false}, {"no margin", -1, true}} {
		t.Run(tc.name, func(t *testing.T) {
			holder := newStore(t, api, dynamostore.Options{ClockSkew: tc.skew})
			ahead, err := dynamostore.New(api, holder.Options())
			require.NoError(t, err)
			base := newClock()
			dynamostore.SetClock(holder, base.Now)
			dynamostore.SetClock(ahead, func() time.Time { return base.Now().Add(900 * time.Millisecond) })

			l := acquire(t, holder, "k", "holder", 10*time.Second).Lease
			base.Advance(9500 * time.Millisecond) // the holder has 500 ms left
			res := acquire(t, ahead, "k", "ahead", time.Minute)
			if !tc.takenOver {
				require.Equal(t, backends.StatusInProgress, res.Status)
				require.InDelta(t, 600*time.Millisecond, res.Remaining, float64(time.Millisecond),
					"the 500 ms left by the holder's clock, plus the 1 s margin, less the 900 ms the other clock is ahead")
				require.NoError(t, holder.Renew(ctx(t), l, 10*time.Second), "still the holder's")
				return
			}
			require.Equal(t, backends.StatusAcquired, res.Status, "taken over while the holder counts 500 ms left")
			require.True(t, res.Lease.Takeover)
			require.ErrorIs(t, holder.Renew(ctx(t), l, 10*time.Second), backends.ErrLeaseLost)
		})
	}
}

// A completed record is forgotten only the skew margin after its
// retention, and an expired lease taken over only the margin after its
// expiry.
func TestClockSkewDelaysTakeoverAndForgetting(t *testing.T) {
	t.Parallel()
	sv := startServer(t)
	s := newStore(t, sv.client(nil), dynamostore.Options{ClockSkew: 2 * time.Second})
	c := newClock()
	dynamostore.SetClock(s, c.Now)

	acquire(t, s, "lease", "a", 10*time.Second)
	c.Advance(11 * time.Second)
	rec, err := s.Inspect(ctx(t), "lease")
	require.NoError(t, err)
	require.Equal(t, backends.StateInProgress, rec.State, "inside the margin")
	require.Equal(t, backends.StatusInProgress, acquire(t, s, "lease", "b", time.Minute).Status)
	c.Advance(1001 * time.Millisecond)
	require.True(t, acquire(t, s, "lease", "b", time.Minute).Lease.Takeover)

	res, err := s.Acquire(ctx(t), backends.AcquireRequest{Key: "done", Owner: "a", LeaseTTL: time.Minute, Retention: 10 * time.Second})
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx(t), res.Lease, []byte("out")))
	c.Advance(11 * time.Second)
	require.Equal(t, backends.StatusCompleted, acquire(t, s, "done", "b", time.Minute).Status, "inside the margin")
	c.Advance(1001 * time.Millisecond)
	again := acquire(t, s, "done", "b", time.Minute)
	require.Equal(t, backends.StatusAcquired, again.Status)
	require.Equal(t, 1, again.Lease.Attempt, "a new record")
	require.Greater(t, again.Lease.Token, res.Lease.Token, "whose token still counts up")
}

// Items written by 0.1.0, which kept no origin or acquisition time, read
// with none: a completed one's lease ends at its completion, as every
// record's does, and a lease in progress is counted without being the
// oldest. The items are 0.1.0's, attribute for attribute.
func TestItemsOf010(t *testing.T) {
	t.Parallel()
	sv := startServer(t)
	api := sv.client(nil)
	s := newStore(t, api, dynamostore.Options{})
	now := time.Now().UnixMilli()
	n := func(v int64) types.AttributeValue {
		return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
	}
	item := func(key string, state int64) map[string]types.AttributeValue {
		return map[string]types.AttributeValue{
			"id": &types.AttributeValueMemberB{Value: []byte(key)}, "state": n(state),
			"owner": &types.AttributeValueMemberS{Value: "old"}, "token": n(1), "attempt": n(1),
			"lease_ms": n(now + 60_000), "retention_ms": n(3_600_000), "forget_ms": n(now + 3_660_000),
			"ttl_after_s": n(3602), "ttl": n((now+3_660_000)/1000 + 2),
		}
	}
	done := item("ns:done", 3)
	done["completed_ms"] = n(now - 1000)
	for _, it := range []map[string]types.AttributeValue{done, item("ns:held", 1)} {
		_, err := api.PutItem(ctx(t), &dynamodb.PutItemInput{TableName: aws.String(s.Options().Table), Item: it})
		require.NoError(t, err)
	}
	rec, err := s.Inspect(ctx(t), "ns:done")
	require.NoError(t, err)
	require.Equal(t, backends.StateCompleted, rec.State)
	require.True(t, rec.LeaseExpiresAt.Equal(rec.CompletedAt))
	require.Empty(t, rec.Origin)
	require.Zero(t, rec.AcquiredAt)
	rec, err = s.Inspect(ctx(t), "ns:held")
	require.NoError(t, err)
	require.Equal(t, backends.StateInProgress, rec.State)
	require.Zero(t, rec.AcquiredAt)
	c, err := s.Count(ctx(t), "ns")
	require.NoError(t, err)
	require.Equal(t, backends.Counts{InProgress: 1, Completed: 1}, c)
}
