package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

var (
	_ backends.Store         = (*Store)(nil)
	_ backends.OutputLimiter = (*Store)(nil)
	_ backends.Lister        = (*Store)(nil)
)

// API is what the store needs from DynamoDB. A *dynamodb.Client satisfies
// it; so does a wrapper of one that adds instrumentation or faults.
type API interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	Scan(ctx context.Context, in *dynamodb.ScanInput, opts ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	UpdateTimeToLive(ctx context.Context, in *dynamodb.UpdateTimeToLiveInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
}

// Defaults and limits.
const (
	// DefaultTable is the default [Options.Table].
	DefaultTable = "idempotency_keys"
	// DefaultClockSkew is the default [Options.ClockSkew].
	DefaultClockSkew = time.Second
	// MaxClockSkew is the largest [Options.ClockSkew].
	MaxClockSkew = time.Hour
	// MaxOutputBytes is the longest output Complete stores: a record with
	// the longest key, owner, fingerprint and origin and this output still
	// fits DynamoDB's 400 KB item.
	MaxOutputBytes = 392 << 10
)

// Options configures a [Store]. The zero value is ready to use.
type Options struct {
	// Table is the records' table; [Store.Migrate] creates it.
	// Defaults to DefaultTable.
	Table string
	// ClockSkew is how far apart the clocks of the processes sharing the
	// table may be. DynamoDB's conditions cannot read a server clock, so
	// each process judges leases by its own: a lease is taken over, and a
	// record forgotten, only ClockSkew after the time its writer recorded.
	// Larger is safer and delays takeovers by as much. At most
	// MaxClockSkew; negative means the clocks agree exactly. Defaults to
	// DefaultClockSkew.
	ClockSkew time.Duration
	// TTL says whether Migrate turns on DynamoDB's Time to Live for the
	// table. Defaults to TTLOn.
	TTL TTL
}

// TTL says whether [Store.Migrate] turns on DynamoDB's Time to Live for
// the table, which deletes records past their retention.
type TTL int

const (
	// TTLOn: Migrate turns Time to Live on, on the ttl attribute. The
	// default.
	TTLOn TTL = iota
	// TTLUntouched: Migrate leaves Time to Live as it finds it: for
	// emulators without UpdateTimeToLive (dynalite), or a table whose TTL
	// your infrastructure code manages. Without TTL, records past their
	// retention stay in the table, ignored, until something deletes them.
	TTLUntouched
)

// Store is a [backends.Store] on DynamoDB. Create it with [New]; create
// its table with [Store.Migrate] or your own infrastructure code.
type Store struct {
	api   API
	table *string
	opts  Options
	skew  int64 // ms
	now   func() time.Time
}

// New returns a store on api. It does not contact DynamoDB. It returns an
// error wrapping [backends.ErrNilClient] for a nil api, and one wrapping
// [backends.ErrInvalidOptions] for a table name DynamoDB refuses, a
// ClockSkew over MaxClockSkew or an unknown TTL.
func New(api API, opts Options) (*Store, error) {
	if storekit.IsNil(api) {
		return nil, fmt.Errorf("dynamostore: %w", backends.ErrNilClient)
	}
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	if opts.ClockSkew == 0 {
		opts.ClockSkew = DefaultClockSkew
	}
	if opts.ClockSkew > MaxClockSkew {
		return nil, fmt.Errorf("dynamostore: %w: ClockSkew %v is over %v", backends.ErrInvalidOptions, opts.ClockSkew, MaxClockSkew)
	}
	if opts.TTL != TTLOn && opts.TTL != TTLUntouched {
		return nil, fmt.Errorf("dynamostore: %w: unknown TTL %d", backends.ErrInvalidOptions, int(opts.TTL))
	}
	if n := len(opts.Table); n < 3 || n > 255 || !validTableName(opts.Table) {
		return nil, fmt.Errorf("dynamostore: %w: table name %q: 3 to 255 of a-z, A-Z, 0-9, '_', '-' and '.'", backends.ErrInvalidOptions, opts.Table)
	}
	return &Store{api: api, table: aws.String(opts.Table), opts: opts, skew: ms(max(opts.ClockSkew, 0)), now: time.Now}, nil
}

func validTableName(s string) bool {
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// Options returns the store's options with defaults applied.
func (s *Store) Options() Options { return s.opts }

// MaxOutputBytes implements [backends.OutputLimiter]: [MaxOutputBytes].
func (s *Store) MaxOutputBytes() int { return MaxOutputBytes }

// ms converts d to whole milliseconds, rounding up, so a lease is never
// shorter than asked for.
func ms(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// seconds converts Unix milliseconds to Unix seconds, rounding up.
func seconds(unixMs int64) int64 { return (unixMs + 999) / 1000 }

// opError wraps a failed call's error, marking with [backends.ErrRejected]
// the errors that retrying the call cannot fix.
func opError(op string, err error) error {
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) && rejected(apiErr.ErrorCode()) {
		return fmt.Errorf("dynamostore: %s: %w: %w", op, backends.ErrRejected, err)
	}
	return fmt.Errorf("dynamostore: %s: %w", op, err)
}

// rejected reports whether an error code is one retrying cannot fix: a
// missing table, a request DynamoDB refuses (an item too large, a
// malformed expression), missing credentials or permissions. Throttling,
// server errors and timeouts are transient.
func rejected(code string) bool {
	switch code {
	case "ResourceNotFoundException", "ValidationException", "AccessDeniedException",
		"UnrecognizedClientException", "InvalidSignatureException", "MissingAuthenticationTokenException",
		"IncompleteSignatureException", "SerializationException", "ItemCollectionSizeLimitExceededException":
		return true
	}
	return false
}

// conditionFailed reports whether err is a failed condition, and returns
// the item DynamoDB sent back with it (ALL_OLD), if any.
func conditionFailed(err error) (map[string]types.AttributeValue, bool) {
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return ccf.Item, true
	}
	return nil, false
}

// update runs one conditional UpdateItem on key's record.
func (s *Store) update(ctx context.Context, key, set, cond string, vals map[string]types.AttributeValue, ret types.ReturnValue) (*dynamodb.UpdateItemOutput, error) {
	e := bind(vals, set, cond)
	return s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           s.table,
		Key:                                 keyOf(key),
		UpdateExpression:                    aws.String(set),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            e.Names,
		ExpressionAttributeValues:           e.Values,
		ReturnValues:                        ret,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
}

// get reads key's record with a strongly consistent read; ok is false if
// there is no item.
func (s *Store) get(ctx context.Context, key string) (it item, ok bool, err error) {
	out, err := s.api.GetItem(ctx, &dynamodb.GetItemInput{TableName: s.table, Key: keyOf(key), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return item{}, false, err
	}
	if len(out.Item) == 0 {
		return item{}, false, nil
	}
	it, err = decode(out.Item)
	return it, err == nil, err
}

// Inspect implements [backends.Store], with a strongly consistent read.
func (s *Store) Inspect(ctx context.Context, key string) (backends.Record, error) {
	if err := storekit.ValidateKey(key); err != nil {
		return backends.Record{}, err
	}
	it, ok, err := s.get(ctx, key)
	if err != nil {
		return backends.Record{}, opError("inspect", err)
	}
	if !ok {
		return backends.Record{}, backends.ErrNotFound
	}
	st, ok := s.judge(it, s.now().UnixMilli())
	if !ok {
		return backends.Record{}, backends.ErrNotFound
	}
	return s.record(it, st), nil
}

// Delete implements [backends.Store].
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := storekit.ValidateKey(key); err != nil {
		return err
	}
	out, err := s.api.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: s.table, Key: keyOf(key), ReturnValues: types.ReturnValueAllOld})
	if err != nil {
		return opError("delete", err)
	}
	if len(out.Attributes) == 0 {
		return backends.ErrNotFound
	}
	it, err := decode(out.Attributes)
	if err != nil {
		return err
	}
	if _, ok := s.judge(it, s.now().UnixMilli()); !ok {
		return backends.ErrNotFound // deleted, but it already counted as absent
	}
	return nil
}

// held is the condition that the lease is still its owner's: the record
// has not been taken over, released, completed or forgotten.
const held = `#owner = :owner AND #token = :token AND #state = :one AND #forget > :now`

// heldUpdate runs set on the lease's record if the lease is still held.
func (s *Store) heldUpdate(ctx context.Context, op string, lease backends.Lease, set string, more map[string]types.AttributeValue) error {
	if err := storekit.ValidateLease(lease); err != nil {
		return err
	}
	now := s.now().UnixMilli()
	vals := values(more)
	vals[":owner"], vals[":token"], vals[":now"], vals[":now_s"] = str(lease.Owner), num(lease.Token), num(now), num(seconds(now))
	_, err := s.update(ctx, lease.Key, set, held, vals, types.ReturnValueNone)
	if _, failed := conditionFailed(err); failed {
		return backends.ErrLeaseLost
	}
	if err != nil {
		return opError(op, err)
	}
	return nil
}

// Renew implements [backends.Store].
func (s *Store) Renew(ctx context.Context, lease backends.Lease, ttl time.Duration) error {
	if err := storekit.ValidateLeaseTTL(ttl); err != nil {
		return err
	}
	until := s.now().UnixMilli() + ms(ttl)
	return s.heldUpdate(ctx, "renew", lease,
		`SET #lease = :lease, #forget = :lease + #retention, #ttl = :lease_s + #ttl_after`,
		map[string]types.AttributeValue{":lease": num(until), ":lease_s": num(seconds(until))})
}

// Complete implements [backends.Store]. It refuses an output longer than
// [MaxOutputBytes] with an error wrapping [backends.ErrInvalidRequest].
func (s *Store) Complete(ctx context.Context, lease backends.Lease, output []byte) error {
	if len(output) > MaxOutputBytes {
		return fmt.Errorf("%w: output of %d bytes, the limit is %d (DynamoDB's 400 KB item)", backends.ErrInvalidRequest, len(output), MaxOutputBytes)
	}
	set := `SET #state = :three, #completed = :now, #forget = :now + #retention, #ttl = :now_s + #ttl_after`
	more := map[string]types.AttributeValue{}
	if len(output) > 0 {
		set += `, #output = :output`
		more[":output"] = bin(output)
	} else {
		set += ` REMOVE #output`
	}
	return s.heldUpdate(ctx, "complete", lease, set, more)
}

// Release implements [backends.Store].
func (s *Store) Release(ctx context.Context, lease backends.Lease) error {
	return s.heldUpdate(ctx, "release", lease, `SET #state = :two, #forget = :now + #retention, #ttl = :now_s + #ttl_after`, nil)
}

func msDuration(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
