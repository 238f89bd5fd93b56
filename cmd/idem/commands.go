package main

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/dynamostore"
	"github.com/watermill-idempotency/idempotency/keyfunc"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// The values of the action field in the JSON output of release, complete
// and delete. They are stable: scripts compare them.
const (
	actionReleased         = "released"          // release: the lease is given up; the next delivery runs
	actionCompleted        = "completed"         // complete: the key is completed; the next delivery is dropped
	actionAlreadyCompleted = "already_completed" // complete: it was completed already; nothing changed
	actionDeleted          = "deleted"           // delete: the record is gone; the next delivery runs
	actionNotFound         = "not_found"         // exit 2: the key has no record
	actionInProgress       = "in_progress"       // exit 3: the key is in progress, a live lease holds it; --force to act anyway
	actionNoLease          = "no_lease"          // exit 3: release found no lease to give up
	actionChanged          = "changed"           // exit 3: the record changed since it was inspected; nothing changed
)

// outcome is what a command that acts on one key did.
type outcome struct {
	action, message string
	// record is the key's record afterwards, if there is one to show.
	record *backends.Record
}

// actionView is the JSON output of release, complete and delete.
type actionView struct {
	Key       string      `json:"key"`
	KeyBase64 string      `json:"key_base64,omitempty"`
	Action    string      `json:"action"`
	Message   string      `json:"message"`
	Record    *recordView `json:"record,omitempty"`
}

// act runs do, which acts on key, and reports its outcome. With -o json a
// refusal or a missing record is reported on stdout too, with its action,
// as well as by its exit code and its line on stderr.
func (e *env) act(key string, do func() (outcome, error)) error {
	o, err := do()
	var coded codedError
	switch {
	case err == nil:
	case e.g.output == "json" && errors.As(err, &coded) && coded.action != "":
		if perr := printJSON(e.stdout, newActionView(key, coded.action, coded.err.Error(), nil)); perr != nil {
			return perr
		}
		return err
	default:
		return err
	}
	if e.g.output == "json" {
		return printJSON(e.stdout, newActionView(key, o.action, o.message, o.record))
	}
	fmt.Fprintf(e.stdout, "%q: %s\n", key, o.message)
	return nil
}

func newActionView(key, action, message string, rec *backends.Record) actionView {
	v := actionView{Key: key, Action: action, Message: message}
	if !utf8.ValidString(key) {
		v.KeyBase64 = base64.StdEncoding.EncodeToString([]byte(key))
	}
	if rec != nil {
		r := viewRecord(*rec, time.Now())
		v.Record = &r
	}
	return v
}

// inspect returns the key's record, or a not-found error.
func (e *env) inspect(ctx context.Context, key string) (backends.Record, error) {
	rec, err := e.store.Inspect(ctx, key)
	if errors.Is(err, backends.ErrNotFound) {
		return rec, noRecord(key)
	}
	return rec, err
}

func noRecord(key string) error {
	return notFound(key, "has no record (never seen, or forgotten after its retention)")
}

// actOnRecord is what release, complete and delete share: it inspects
// key, runs do with its record, and reports the outcome as act does. A
// key without a record is a not-found error, unless missing is not nil:
// then missing decides.
func (e *env) actOnRecord(ctx context.Context, key string, missing func() (outcome, error), do func(rec backends.Record) (outcome, error)) error {
	return e.act(key, func() (outcome, error) {
		rec, err := e.store.Inspect(ctx, key)
		switch {
		case errors.Is(err, backends.ErrNotFound) && missing != nil:
			return missing()
		case errors.Is(err, backends.ErrNotFound):
			return outcome{}, noRecord(key)
		case err != nil:
			return outcome{}, err
		}
		return do(rec)
	})
}

// held refuses to act on a key that a live lease holds, without --force;
// verb is the command.
func held(key, verb string, rec backends.Record) error {
	return refused(actionInProgress, key, "is in progress: owner %s (token %d) holds it for %v more: --force to %s it anyway",
		rec.Owner, rec.Token, time.Until(rec.LeaseExpiresAt).Round(time.Millisecond), verb)
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
			return argsError{usageError{errors.New("want at least one KEY")}}
		}
		if len(args) == 1 {
			rec, err := e.inspect(ctx, args[0])
			if err != nil {
				return err
			}
			return e.show(rec)
		}
		// Each key not found is a line of its own on stderr; the records
		// found are printed all the same.
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
			return codedError{code: exitNotFound, err: errReported}
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
		return e.actOnRecord(ctx, key, nil, func(rec backends.Record) (outcome, error) {
			if rec.State != backends.StateInProgress && rec.State != backends.StateExpired {
				return outcome{}, refused(actionNoLease, key, "is %s: there is no lease to release", rec.State)
			}
			err := e.store.Release(ctx, leaseOf(rec))
			if errors.Is(err, backends.ErrLeaseLost) {
				return outcome{}, refused(actionChanged, key, "changed since it was inspected (owner %s, token %d): nothing released", rec.Owner, rec.Token)
			}
			if err != nil {
				return outcome{}, err
			}
			return outcome{action: actionReleased, message: fmt.Sprintf("released the lease of owner %s, token %d: the next delivery runs", rec.Owner, rec.Token)}, nil
		})
	},
}

// operatorOwner is the owner of the leases idem takes itself.
func operatorOwner() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("idem@%s/%d", host, os.Getpid())
}

type completeOpts struct {
	force, create bool
	retention     time.Duration
}

var completeCmd = &command{
	name: "complete", args: "KEY", store: true,
	help: "mark KEY as handled, without output: the next delivery is dropped as a duplicate; --force takes a live lease, --create records a key that has no record",
	flags: func(fs *flag.FlagSet) any {
		o := &completeOpts{}
		fs.BoolVar(&o.force, "force", false, "also when a live lease holds the key (its holder's completion will then fail)")
		fs.BoolVar(&o.create, "create", false, "also when the key has no record: record it as completed")
		fs.DurationVar(&o.retention, "retention", idempotency.DefaultRetention, "how long the completed key is remembered")
		return o
	},
	run: func(ctx context.Context, e *env, opts any, args []string) error {
		o := opts.(*completeOpts)
		if err := exactArgs(args, 1, "one KEY"); err != nil {
			return err
		}
		key := args[0]
		if ns, _, ok := strings.Cut(key, ":"); o.create && (!ok || ns == "") {
			return usageError{fmt.Errorf("%q has no namespace: --create takes the full key, namespace:key, where the namespace is the handler's name unless Config.Namespace is set", key)}
		}
		missing := func() (outcome, error) {
			if !o.create {
				return outcome{}, notFound(key, "has no record, so nothing to complete: --create to record it as completed")
			}
			return completeKey(ctx, e, o, key)
		}
		return e.actOnRecord(ctx, key, missing, func(rec backends.Record) (outcome, error) { return complete(ctx, e, o, key, rec) })
	},
}

// complete completes key, whose record idem inspected.
func complete(ctx context.Context, e *env, o *completeOpts, key string, rec backends.Record) (outcome, error) {
	switch {
	case rec.State == backends.StateCompleted:
		return outcome{actionAlreadyCompleted, "already completed: the next delivery is dropped", &rec}, nil
	case live(rec) && !o.force:
		return outcome{}, held(key, "complete", rec)
	case live(rec):
		if err := e.store.Release(ctx, leaseOf(rec)); errors.Is(err, backends.ErrLeaseLost) {
			return outcome{}, refused(actionChanged, key, "changed since it was inspected: not completed")
		} else if err != nil {
			return outcome{}, err
		}
	}
	return completeKey(ctx, e, o, key)
}

// completeKey takes a lease on key, which no live lease holds, and
// completes it.
func completeKey(ctx context.Context, e *env, o *completeOpts, key string) (outcome, error) {
	res, err := e.store.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: operatorOwner(), LeaseTTL: 30 * time.Second, Retention: o.retention,
		Origin: "idem complete"})
	if err != nil {
		return outcome{}, err
	}
	switch res.Status {
	case backends.StatusCompleted:
		return outcome{actionAlreadyCompleted, "already completed: the next delivery is dropped", nil}, nil
	case backends.StatusInProgress:
		return outcome{}, refused(actionChanged, key, "was taken by another holder since it was inspected: not completed")
	}
	if err := e.store.Complete(ctx, res.Lease, nil); errors.Is(err, backends.ErrLeaseLost) {
		return outcome{}, refused(actionChanged, key, "was taken from idem's lease before it completed: not completed")
	} else if err != nil {
		return outcome{}, err
	}
	after, err := e.inspect(ctx, key)
	if err != nil {
		return outcome{}, err
	}
	return outcome{actionCompleted, fmt.Sprintf("completed with token %d: the next delivery is dropped", res.Lease.Token), &after}, nil
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
		return e.actOnRecord(ctx, key, nil, func(rec backends.Record) (outcome, error) {
			if live(rec) && !opts.(*forceOpts).force {
				return outcome{}, held(key, "delete", rec)
			}
			if err := e.store.Delete(ctx, key); errors.Is(err, backends.ErrNotFound) {
				return outcome{}, notFound(key, "is gone since it was inspected")
			} else if err != nil {
				return outcome{}, err
			}
			return outcome{action: actionDeleted, message: fmt.Sprintf("deleted (was %s, token %d): the next delivery runs", rec.State, rec.Token)}, nil
		})
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
		if errors.Is(err, backends.ErrInvalidCursor) {
			return usageError{badCursor(o, err)}
		}
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
		if len(views) == 0 && o.cursor == "" {
			defer e.explainEmpty(ctx, o.namespace)
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

// badCursor says why the store refused a --cursor. The cursor is opaque
// (backends.ListRequest): idem passes it to the store as given, and the
// store refuses one that is malformed or, for the stores of this module,
// of another namespace, rather than answering with a page that is wrongly
// empty.
func badCursor(o *listOpts, err error) error {
	if o.namespace == "" {
		return fmt.Errorf("--cursor %q is not a cursor idem list printed: %w", o.cursor, err)
	}
	return fmt.Errorf("--cursor %q is not a cursor idem list printed for namespace %q: %w", o.cursor, o.namespace, err)
}

type namespaceOpts struct{ namespace string }

var statsCmd = &command{
	name: "stats", args: "", store: true,
	help: "count a namespace's records by state, and say when the oldest lease in progress was acquired",
	flags: func(fs *flag.FlagSet) any {
		o := &namespaceOpts{}
		fs.StringVar(&o.namespace, "namespace", "", "the namespace; empty for every key")
		return o
	},
	run: func(ctx context.Context, e *env, opts any, args []string) error {
		if err := exactArgs(args, 0, "no arguments"); err != nil {
			return err
		}
		ns := opts.(*namespaceOpts).namespace
		c, err := e.store.Count(ctx, ns)
		if err != nil {
			return err
		}
		if e.g.output == "json" {
			out := map[string]any{
				"in_progress": c.InProgress, "expired": c.Expired, "released": c.Released, "completed": c.Completed, "total": c.Total(),
				"oldest_in_progress": nil,
			}
			if !c.OldestInProgress.IsZero() {
				out["oldest_in_progress"] = c.OldestInProgress.UTC()
			}
			err = printJSON(e.stdout, out)
		} else {
			// How long the oldest lease in progress has been held: what
			// "stuck" means to an operator.
			oldest := "-"
			if !c.OldestInProgress.IsZero() {
				oldest = fmt.Sprintf("%s ago, at %s", ago(c.OldestInProgress), stamp(c.OldestInProgress))
			}
			_, err = fmt.Fprintf(e.stdout, "in_progress %d\nexpired     %d\nreleased    %d\ncompleted   %d\ntotal       %d\noldest in progress acquired %s\n",
				c.InProgress, c.Expired, c.Released, c.Completed, c.Total(), oldest)
		}
		if err == nil && c.Total() == 0 {
			e.explainEmpty(ctx, ns)
		}
		return err
	},
}

type keyOpts struct {
	metadata, namespace, uuid            string
	jsonField                            stringsFlag
	byUUID, payloadHash, hashed, inspect bool
	set                                  metadataFlag
}

var keyCmd = &command{
	name: "key", args: "< PAYLOAD",
	help: "compute a message's stored key as the middleware does, namespace:key, from the payload on stdin; --inspect looks it up",
	flags: func(fs *flag.FlagSet) any {
		o := &keyOpts{}
		fs.Var(&o.jsonField, "json-field", "keyfunc.JSONField: a field `name` of the JSON payload, taken literally; repeat it once per level: --json-field order --json-field id is JSONField(\"order\", \"id\")")
		fs.StringVar(&o.metadata, "metadata", "", "keyfunc.Metadata: a metadata entry (give it with --set)")
		fs.BoolVar(&o.byUUID, "uuid", false, "keyfunc.UUID: the message UUID (give it with --message-uuid)")
		fs.BoolVar(&o.payloadHash, "payload-hash", false, "keyfunc.PayloadHash: the SHA-256 of the payload")
		fs.BoolVar(&o.hashed, "hashed", false, "keyfunc.Hashed around the extractor")
		fs.StringVar(&o.namespace, "namespace", "", "required: the namespace, the handler's name unless Config.Namespace is set")
		fs.StringVar(&o.uuid, "message-uuid", "", "the message's UUID")
		fs.Var(&o.set, "set", "a metadata entry `name=value` (repeatable)")
		fs.BoolVar(&o.inspect, "inspect", false, "also print the key's record from the store")
		return o
	},
	run: func(ctx context.Context, e *env, opts any, args []string) error {
		o := opts.(*keyOpts)
		if err := exactArgs(args, 0, "no arguments (the payload comes on stdin)"); err != nil {
			return err
		}
		// The middleware stores namespace + ":" + the extracted key, the
		// namespace being the handler's name unless Config.Namespace is
		// set: without it there is no stored key to print.
		if o.namespace == "" {
			return usageError{errors.New("--namespace is required: the middleware stores namespace:key, where the namespace is the handler's name unless Config.Namespace is set")}
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
		for k, v := range o.set.entries {
			msg.Metadata.Set(k, v)
		}
		k, err := ex.Key(msg)
		if err == nil && k == "" {
			err = errors.New("the extractor returned an empty key")
		}
		if err != nil {
			if errors.Is(err, keyfunc.ErrNoKey) && len(o.jsonField.values) == 1 && strings.Contains(o.jsonField.values[0], ".") {
				err = fmt.Errorf("%w (--json-field takes one field name per level, as keyfunc.JSONField does: --json-field %s)",
					err, strings.Join(strings.Split(o.jsonField.values[0], "."), " --json-field "))
			}
			return fmt.Errorf("no key: %w", err)
		}
		k = o.namespace + ":" + k
		if !o.inspect {
			if e.g.output == "json" {
				return printJSON(e.stdout, map[string]string{"key": k})
			}
			fmt.Fprintln(e.stdout, k)
			return nil
		}
		s, closeFn, err := storeOpener(ctx, e.g, true)
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

// extractor is the keyfunc extractor the flags name, built by keyfunc
// itself so that idem computes the key the middleware computes.
func (o *keyOpts) extractor() (keyfunc.Extractor, error) {
	var chosen []keyfunc.Extractor
	if len(o.jsonField.values) > 0 {
		chosen = append(chosen, keyfunc.JSONField(o.jsonField.values...))
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

type dynamoOpts struct{ ttl string }

var dynamoCmd = &command{
	name: "dynamodb", args: "migrate [--ttl on|untouched]", storeName: "dynamodb",
	help: "DynamoDB store: create its table, on-demand, with Time to Live on its ttl attribute (migrate)",
	// DynamoDB takes seconds to tens of seconds to make a new table active.
	timeout: 2 * time.Minute,
	flags: func(fs *flag.FlagSet) any {
		o := &dynamoOpts{}
		fs.StringVar(&o.ttl, "ttl", "on", "migrate: turn Time to Live on (on), or leave it as it is (untouched): for emulators without UpdateTimeToLive (dynalite); forgotten records then stay, ignored")
		return o
	},
	run: func(ctx context.Context, e *env, opts any, args []string) error {
		if err := exactArgs(args, 1, "migrate"); err != nil {
			return err
		}
		if args[0] != "migrate" {
			return usageError{fmt.Errorf("unknown dynamodb command %q: migrate", args[0])}
		}
		switch o := opts.(*dynamoOpts); o.ttl {
		case "on":
			e.g.dynamoTTL = dynamostore.TTLOn
		case "untouched":
			e.g.dynamoTTL = dynamostore.TTLUntouched
		default:
			return usageError{fmt.Errorf("--ttl must be on or untouched, got %q", o.ttl)}
		}
		s, closeFn, err := openStore(ctx, e.g, false)
		if err != nil {
			return err
		}
		defer closeFn()
		if err := s.(*dynamostore.Store).Migrate(ctx); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "table %s is ready\n", e.g.dynamoTable)
		return nil
	},
}
