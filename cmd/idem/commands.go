package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/dynamostore"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// inspect returns the key's record, or a not-found error.
func (e *env) inspect(ctx context.Context, key string) (backends.Record, error) {
	rec, err := e.store.Inspect(ctx, key)
	if errors.Is(err, backends.ErrNotFound) {
		return rec, notFound("%q: no record (never seen, or forgotten after its retention)", key)
	}
	return rec, err
}

// show prints one record in the chosen format.
func (e *env) show(rec backends.Record) error {
	v := viewRecord(rec, time.Now())
	if e.g.output == "json" {
		return printJSON(e.stdout, v)
	}
	printRecord(e.stdout, v)
	return nil
}

// done reports what a command did, as text or as JSON.
func (e *env) done(key, action string, rec *backends.Record) error {
	if e.g.output == "json" {
		out := map[string]any{"key": key, "action": action}
		if rec != nil {
			out["record"] = viewRecord(*rec, time.Now())
		}
		return printJSON(e.stdout, out)
	}
	fmt.Fprintf(e.stdout, "%q: %s\n", key, action)
	return nil
}

// live reports whether the record is held by a lease that has not run out.
func live(rec backends.Record) bool { return rec.State == backends.StateInProgress }

func leaseOf(rec backends.Record) backends.Lease {
	return backends.Lease{Key: rec.Key, Owner: rec.Owner, Token: rec.Token, Attempt: rec.Attempt}
}

var inspectCmd = &command{
	name: "inspect", args: "KEY...", store: true,
	help: "print each key's record: state, owner, fencing token, time left on the lease, when it is forgotten, stored output",
	run: func(ctx context.Context, e *env, _ any, args []string) error {
		if len(args) == 0 {
			return usageError{errors.New("want at least one KEY")}
		}
		missing := 0
		for i, key := range args {
			rec, err := e.inspect(ctx, key)
			var ce codedError
			if errors.As(err, &ce) && ce.code == exitNotFound {
				fmt.Fprintln(e.stderr, "idem:", err)
				missing++
				continue
			}
			if err != nil {
				return err
			}
			if i > 0 && e.g.output == "table" {
				fmt.Fprintln(e.stdout)
			}
			if err := e.show(rec); err != nil {
				return err
			}
		}
		if missing > 0 {
			return notFound("%d of %d keys not found", missing, len(args))
		}
		return nil
	},
}

var releaseCmd = &command{
	name: "release", args: "KEY", store: true,
	help: "give up the lease on KEY that idem inspects first, so the next delivery runs at once; never a newer holder's lease",
	run: func(ctx context.Context, e *env, _ any, args []string) error {
		if err := exactArgs(args, 1, "one KEY"); err != nil {
			return err
		}
		key := args[0]
		rec, err := e.inspect(ctx, key)
		if err != nil {
			return err
		}
		if rec.State != backends.StateInProgress && rec.State != backends.StateExpired {
			return refused("%q is %s: there is no lease to release", key, rec.State)
		}
		err = e.store.Release(ctx, leaseOf(rec))
		if errors.Is(err, backends.ErrLeaseLost) {
			return refused("%q changed since it was inspected (owner %s, token %d): nothing released", key, rec.Owner, rec.Token)
		}
		if err != nil {
			return err
		}
		return e.done(key, fmt.Sprintf("released the lease of owner %s, token %d: the next delivery runs", rec.Owner, rec.Token), nil)
	},
}

// operatorOwner is the owner of the leases idem takes itself.
func operatorOwner() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("idem@%s/%d", host, os.Getpid())
}

type completeOpts struct {
	force     bool
	retention time.Duration
}

var completeCmd = &command{
	name: "complete", args: "KEY", store: true,
	help: "mark KEY as handled, without output: the next delivery is dropped as a duplicate; --force takes a live lease",
	flags: func(fs *flag.FlagSet) any {
		o := &completeOpts{}
		fs.BoolVar(&o.force, "force", false, "also when a live lease holds the key (its holder's completion will then fail)")
		fs.DurationVar(&o.retention, "retention", idempotency.DefaultRetention, "how long the completed key is remembered")
		return o
	},
	run: func(ctx context.Context, e *env, opts any, args []string) error {
		o := opts.(*completeOpts)
		if err := exactArgs(args, 1, "one KEY"); err != nil {
			return err
		}
		key := args[0]
		rec, err := e.store.Inspect(ctx, key)
		switch {
		case errors.Is(err, backends.ErrNotFound):
		case err != nil:
			return err
		case rec.State == backends.StateCompleted:
			return e.done(key, "already completed", &rec)
		case live(rec) && !o.force:
			return refused("%q is held by owner %s (token %d) for %v more: --force to complete it anyway",
				key, rec.Owner, rec.Token, time.Until(rec.LeaseExpiresAt).Round(time.Millisecond))
		case live(rec):
			if err := e.store.Release(ctx, leaseOf(rec)); errors.Is(err, backends.ErrLeaseLost) {
				return refused("%q changed since it was inspected: not completed", key)
			} else if err != nil {
				return err
			}
		}
		res, err := e.store.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: operatorOwner(), LeaseTTL: 30 * time.Second, Retention: o.retention})
		if err != nil {
			return err
		}
		switch res.Status {
		case backends.Completed:
			return e.done(key, "already completed", nil)
		case backends.InProgress:
			return refused("%q was taken by another holder since it was inspected: not completed", key)
		}
		if err := e.store.Complete(ctx, res.Lease, nil); err != nil {
			return err
		}
		after, err := e.inspect(ctx, key)
		if err != nil {
			return err
		}
		return e.done(key, fmt.Sprintf("completed with token %d: the next delivery is dropped", res.Lease.Token), &after)
	},
}

type forceOpts struct{ force bool }

var deleteCmd = &command{
	name: "delete", args: "KEY", store: true,
	help: "forget KEY: the next delivery runs the handler; --force when a live lease holds it",
	flags: func(fs *flag.FlagSet) any {
		o := &forceOpts{}
		fs.BoolVar(&o.force, "force", false, "also when a live lease holds the key (a duplicate may then run beside its holder)")
		return o
	},
	run: func(ctx context.Context, e *env, opts any, args []string) error {
		if err := exactArgs(args, 1, "one KEY"); err != nil {
			return err
		}
		key := args[0]
		rec, err := e.inspect(ctx, key)
		if err != nil {
			return err
		}
		if live(rec) && !opts.(*forceOpts).force {
			return refused("%q is held by owner %s (token %d) for %v more: --force to delete it anyway",
				key, rec.Owner, rec.Token, time.Until(rec.LeaseExpiresAt).Round(time.Millisecond))
		}
		if err := e.store.Delete(ctx, key); errors.Is(err, backends.ErrNotFound) {
			return notFound("%q: gone since it was inspected", key)
		} else if err != nil {
			return err
		}
		return e.done(key, fmt.Sprintf("deleted (was %s, token %d): the next delivery runs", rec.State, rec.Token), nil)
	},
}

type listOpts struct {
	namespace, state, cursor string
	limit                    int
}

var listCmd = &command{
	name: "list", args: "", store: true,
	help: "list a namespace's records, a page at a time, in key order",
	flags: func(fs *flag.FlagSet) any {
		o := &listOpts{}
		fs.StringVar(&o.namespace, "namespace", "", "the namespace (the handler name, or Config.Namespace); empty for every key")
		fs.StringVar(&o.state, "state", "", "only records in this state: in_progress, expired, released or completed")
		fs.IntVar(&o.limit, "limit", 100, fmt.Sprintf("records per page, 1 to %d", backends.MaxListLimit))
		fs.StringVar(&o.cursor, "cursor", "", "the cursor a previous page printed")
		return o
	},
	run: func(ctx context.Context, e *env, opts any, args []string) error {
		o := opts.(*listOpts)
		if err := exactArgs(args, 0, "no arguments"); err != nil {
			return err
		}
		req := backends.ListRequest{Namespace: o.namespace, Limit: o.limit, Cursor: o.cursor}
		if o.state != "" {
			st, err := backends.ParseState(o.state)
			if err != nil {
				return usageError{err}
			}
			req.State = st
		}
		page, err := e.store.List(ctx, req)
		if errors.Is(err, backends.ErrInvalidRequest) {
			return usageError{err}
		}
		if err != nil {
			return err
		}
		now := time.Now()
		views := make([]recordView, len(page.Records))
		for i, r := range page.Records {
			views[i] = viewRecord(r, now)
		}
		if e.g.output == "json" {
			return printJSON(e.stdout, struct {
				Records []recordView `json:"records"`
				Cursor  string       `json:"cursor"`
			}{views, page.Cursor})
		}
		printRecords(e.stdout, views)
		if page.Cursor != "" {
			fmt.Fprintf(e.stdout, "\nmore: --cursor %s\n", page.Cursor)
		}
		return nil
	},
}

type namespaceOpts struct{ namespace string }

var statsCmd = &command{
	name: "stats", args: "", store: true,
	help: "count a namespace's records by state",
	flags: func(fs *flag.FlagSet) any {
		o := &namespaceOpts{}
		fs.StringVar(&o.namespace, "namespace", "", "the namespace; empty for every key")
		return o
	},
	run: func(ctx context.Context, e *env, opts any, args []string) error {
		if err := exactArgs(args, 0, "no arguments"); err != nil {
			return err
		}
		c, err := e.store.Count(ctx, opts.(*namespaceOpts).namespace)
		if err != nil {
			return err
		}
		if e.g.output == "json" {
			return printJSON(e.stdout, map[string]int64{
				"in_progress": c.InProgress, "expired": c.Expired, "released": c.Released, "completed": c.Completed, "total": c.Total(),
			})
		}
		fmt.Fprintf(e.stdout, "in_progress %d\nexpired     %d\nreleased    %d\ncompleted   %d\ntotal       %d\n",
			c.InProgress, c.Expired, c.Released, c.Completed, c.Total())
		return nil
	},
}

type keyOpts struct {
	jsonField, metadata, namespace, uuid string
	byUUID, payloadHash, hashed, inspect bool
	set                                  metadataFlag
}

// metadataFlag collects repeated --set name=value flags.
type metadataFlag map[string]string

func (m metadataFlag) String() string { return "" }

func (m metadataFlag) Set(v string) error {
	name, value, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return fmt.Errorf("want name=value, got %q", v)
	}
	m[name] = value
	return nil
}

var keyCmd = &command{
	name: "key", args: "< PAYLOAD",
	help: "compute a message's key as the middleware does, from the payload on stdin; --inspect looks it up",
	flags: func(fs *flag.FlagSet) any {
		o := &keyOpts{set: metadataFlag{}}
		fs.StringVar(&o.jsonField, "json-field", "", "keyfunc.JSONField: a field of the JSON payload, nested fields joined by dots (order.id)")
		fs.StringVar(&o.metadata, "metadata", "", "keyfunc.Metadata: a metadata entry (give it with --set)")
		fs.BoolVar(&o.byUUID, "uuid", false, "keyfunc.UUID: the message UUID (give it with --message-uuid)")
		fs.BoolVar(&o.payloadHash, "payload-hash", false, "keyfunc.PayloadHash: the SHA-256 of the payload")
		fs.BoolVar(&o.hashed, "hashed", false, "keyfunc.Hashed around the extractor")
		fs.StringVar(&o.namespace, "namespace", "", "the namespace: the handler name, or Config.Namespace")
		fs.StringVar(&o.uuid, "message-uuid", "", "the message's UUID")
		fs.Var(o.set, "set", "a metadata entry name=value (repeatable)")
		fs.BoolVar(&o.inspect, "inspect", false, "also print the key's record from the store")
		return o
	},
	run: func(ctx context.Context, e *env, opts any, args []string) error {
		o := opts.(*keyOpts)
		if err := exactArgs(args, 0, "no arguments (the payload comes on stdin)"); err != nil {
			return err
		}
		ex, err := o.extractor()
		if err != nil {
			return err
		}
		payload, err := io.ReadAll(e.stdin)
		if err != nil {
			return fmt.Errorf("reading the payload: %w", err)
		}
		msg := message.NewMessage(o.uuid, payload)
		for k, v := range o.set {
			msg.Metadata.Set(k, v)
		}
		k, err := ex.Key(msg)
		if err == nil && k == "" {
			err = errors.New("the extractor returned an empty key")
		}
		if err != nil {
			return fmt.Errorf("no key: %w", err)
		}
		if o.namespace != "" {
			k = o.namespace + ":" + k
		}
		if !o.inspect {
			if e.g.output == "json" {
				return printJSON(e.stdout, map[string]string{"key": k})
			}
			fmt.Fprintln(e.stdout, k)
			return nil
		}
		if o.namespace == "" {
			return usageError{errors.New("--inspect needs --namespace: stored keys are namespace:key")}
		}
		s, closeFn, err := openStore(ctx, e.g, true)
		if err != nil {
			return err
		}
		defer closeFn()
		e.store = s
		rec, err := e.inspect(ctx, k)
		if err != nil {
			return err
		}
		return e.show(rec)
	},
}

func (o *keyOpts) extractor() (keyfunc.Extractor, error) {
	var chosen []keyfunc.Extractor
	if o.jsonField != "" {
		chosen = append(chosen, keyfunc.JSONField(strings.Split(o.jsonField, ".")...))
	}
	if o.metadata != "" {
		chosen = append(chosen, keyfunc.Metadata(o.metadata))
	}
	if o.byUUID {
		chosen = append(chosen, keyfunc.UUID())
	}
	if o.payloadHash {
		chosen = append(chosen, keyfunc.PayloadHash())
	}
	if len(chosen) != 1 {
		return nil, usageError{errors.New("give exactly one of --json-field, --metadata, --uuid, --payload-hash")}
	}
	ex := chosen[0]
	if o.hashed {
		ex = keyfunc.Hashed(ex)
	}
	if err := keyfunc.Validate(ex); err != nil {
		return nil, usageError{err}
	}
	return ex, nil
}

type sqlOpts struct{ batch int }

// sqlCmd is `idem pg` or `idem mysql`: the commands of the store on a
// SQL database.
func sqlCmd(name, store, product string, table func(*globals) string) *command {
	return &command{
		name: name, args: "migrate | schema | cleanup", storeName: store,
		help: product + " store: create its table (migrate), print the SQL for a migration tool (schema), delete forgotten records (cleanup)",
		flags: func(fs *flag.FlagSet) any {
			o := &sqlOpts{}
			fs.IntVar(&o.batch, "batch", 1000, "cleanup: records deleted per statement")
			return o
		},
		run: func(ctx context.Context, e *env, opts any, args []string) error {
			if err := exactArgs(args, 1, "migrate, schema or cleanup"); err != nil {
				return err
			}
			sub := args[0]
			if sub != "migrate" && sub != "schema" && sub != "cleanup" {
				return usageError{fmt.Errorf("unknown %s command %q: migrate, schema or cleanup", name, sub)}
			}
			if sub == "schema" {
				return printSchema(e)
			}
			batch := opts.(*sqlOpts).batch
			if batch <= 0 {
				return usageError{fmt.Errorf("--batch must be positive, got %d", batch)}
			}
			s, closeFn, err := openStore(ctx, e.g, sub == "cleanup")
			if err != nil {
				return err
			}
			defer closeFn()
			db := s.(sqlStore)
			switch sub {
			case "migrate":
				if err := db.Migrate(ctx); err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "table %s is ready\n", table(e.g))
				return nil
			default:
				var total int64
				for {
					n, err := db.Cleanup(ctx, batch)
					if err != nil {
						return err
					}
					total += n
					if n < int64(batch) {
						break
					}
				}
				fmt.Fprintf(e.stdout, "deleted %d forgotten records\n", total)
				return nil
			}
		},
	}
}

var (
	pgCmd    = sqlCmd("pg", "postgres", "Postgres", func(g *globals) string { return g.pgSchema + "." + g.pgTable })
	mysqlCmd = sqlCmd("mysql", "mysql", "MySQL or MariaDB", func(g *globals) string { return g.mysqlTable })
)

type dynamoOpts struct{ noTTL bool }

var dynamoCmd = &command{
	name: "dynamodb", args: "create-table [--no-ttl]", storeName: "dynamodb",
	help: "DynamoDB store: create its table, on-demand, with Time to Live on its ttl attribute (create-table)",
	// DynamoDB takes seconds to tens of seconds to make a new table active.
	timeout: 2 * time.Minute,
	flags: func(fs *flag.FlagSet) any {
		o := &dynamoOpts{}
		fs.BoolVar(&o.noTTL, "no-ttl", false, "leave Time to Live off: for emulators without UpdateTimeToLive (dynalite); forgotten records then stay, ignored")
		return o
	},
	run: func(ctx context.Context, e *env, opts any, args []string) error {
		if err := exactArgs(args, 1, "create-table"); err != nil {
			return err
		}
		if args[0] != "create-table" {
			return usageError{fmt.Errorf("unknown dynamodb command %q: create-table", args[0])}
		}
		s, closeFn, err := openStore(ctx, e.g, false)
		if err != nil {
			return err
		}
		defer closeFn()
		if err := s.(*dynamostore.Store).CreateTable(ctx, dynamostore.TableOptions{NoTTL: opts.(*dynamoOpts).noTTL}); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "table %s is ready\n", e.g.dynamoTable)
		return nil
	},
}
