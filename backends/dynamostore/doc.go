// Package dynamostore is a [backends.Store] on Amazon DynamoDB, for
// services that already keep their state there, such as SQS consumers.
// It is its own Go module, so that the core does not require the AWS SDK.
//
//	cfg, err := config.LoadDefaultConfig(ctx)
//	store, err := dynamostore.New(dynamodb.NewFromConfig(cfg), dynamostore.Options{Table: "idempotency_keys"})
//	err = store.Migrate(ctx) // or create the table with CloudFormation or Terraform
//
// # Protocol
//
// Each key's record is one item, keyed by the key's bytes (a binary
// partition key: keys are byte-exact). Every write is conditional: Renew,
// Complete and Release only while the item still names the lease's owner
// and fencing token; Acquire only in the case the write is for. DynamoDB's
// update expressions cannot choose between values, so Acquire has one
// write per case (a new or forgotten record, a released one, another
// owner's expired lease, the caller's own lease) and tries the likeliest
// first: a new key or a duplicate costs one write; a takeover, an
// acquisition after a release or a re-entrant one two. When a condition
// fails, DynamoDB returns the item it was checked against
// (ReturnValuesOnConditionCheckFailure); from a server that does not, the
// store reads the item with a strongly consistent read. The fencing token
// is incremented in the same write that takes the lease.
//
// # Time
//
// DynamoDB's conditions cannot read a server clock, so each process judges
// leases and retention by its own clock, and writes times from it. A
// lease is taken over, and a record forgotten, only [Options.ClockSkew]
// after the time recorded in it, so that a process whose clock runs ahead
// by less than that never takes over a lease its holder still counts as
// its own. Keep clocks synchronised (Amazon Time Sync, NTP) and ClockSkew
// above their largest difference.
//
// # Record lifetime
//
// A record counts as absent from one retention (plus ClockSkew) after its
// lease ends, it is released or it is completed; correctness never depends
// on it being deleted. Every write sets the ttl attribute past that time,
// so DynamoDB's Time to Live, which deletes expired items lazily (within
// days), reclaims the space.
//
// # Limits
//
// An item holds at most 400 KB, so Complete refuses an output over
// [MaxOutputBytes] (the middleware keeps its MaxOutputBytes within it), and
// Acquire a fingerprint over backends.MaxFingerprintBytes. docs/dynamodb.md has
// the schema, the IAM permissions, the capacity each delivery uses and
// its cost.
package dynamostore
