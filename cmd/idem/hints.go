package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
)

// hintLimit is how many records the look behind an empty answer reads:
// one page of List over every namespace, so that its cost is bounded (on
// Redis and DynamoDB a page is one more scan, as every list and stats is).
const hintLimit = 100

// hintNames is how many of the namespaces found a hint names.
const hintNames = 5

// explainEmpty prints, on stderr, why stats or list found no record in
// namespace ns (every namespace when ns is empty), when one look at the
// store can tell: the namespace is mistyped or ends with its colon,
// other namespaces have records, the Redis prefix lacks its colon, or
// the store has no record at all. The answer itself stands: the look is
// best effort, and a store error during it prints nothing.
func (e *env) explainEmpty(ctx context.Context, ns string) {
	if hint := e.whyEmpty(ctx, ns); hint != "" {
		fmt.Fprintln(e.stderr, "idem:", hint)
	}
}

func (e *env) whyEmpty(ctx context.Context, ns string) string {
	page, err := e.store.List(ctx, backends.ListRequest{Limit: hintLimit})
	if err != nil {
		return ""
	}
	prefixHint := ""
	if e.g.store == "redis" && !strings.HasSuffix(e.g.redisPrefix, ":") {
		prefixHint = fmt.Sprintf("; --redis-prefix %q does not end with a colon, as the services' redisstore.Options.Prefix usually does (%q by default)",
			e.g.redisPrefix, redisstore.DefaultPrefix)
	}
	if len(page.Records) == 0 {
		if ns == "" {
			return fmt.Sprintf("%s has no records %s%s", e.g.where, e.g.recordsPlace(), prefixHint)
		}
		return fmt.Sprintf("namespace %q has no records, nor has any other: %s has none %s%s", ns, e.g.where, e.g.recordsPlace(), prefixHint)
	}
	if ns == "" {
		return "" // records exist, none in the state asked for
	}
	found := map[string]bool{}
	for _, r := range page.Records {
		if strings.HasPrefix(r.Key, ns+":") {
			return "" // the namespace has records, none in the state asked for
		}
		if n, _, ok := strings.Cut(r.Key, ":"); ok {
			found[n] = true
		}
	}
	names := slices.Sorted(maps.Keys(found))
	msg := fmt.Sprintf("namespace %q has no records", ns)
	switch trimmed := strings.TrimRight(ns, ":"); {
	case trimmed != ns && found[trimmed]:
		msg += fmt.Sprintf(": --namespace takes the namespace without the colon that ends it, --namespace %s", trimmed)
	case closest(ns, names) != "":
		msg += fmt.Sprintf(" (did you mean --namespace %s?)", closest(ns, names))
	}
	if found[""] && e.g.store == "redis" && prefixHint != "" {
		// "idempotency" given for "idempotency:": every key read starts
		// with the colon.
		return msg + fmt.Sprintf("; the keys found start with a colon (%q)%s", page.Records[0].Key, prefixHint)
	}
	among := "the namespaces with records"
	if page.Cursor != "" {
		among = fmt.Sprintf("the namespaces of the first %d records", len(page.Records))
	}
	quoted := make([]string, 0, hintNames)
	for _, n := range names[:min(len(names), hintNames)] {
		quoted = append(quoted, strconv.Quote(n))
	}
	list := strings.Join(quoted, ", ")
	if more := len(names) - len(quoted); more > 0 {
		list += fmt.Sprintf(" and %d more", more)
	}
	if len(names) == 0 {
		return msg + fmt.Sprintf("; the records found have keys without a namespace (%q)%s", page.Records[0].Key, prefixHint)
	}
	return msg + fmt.Sprintf("; %s: %s (idem list shows their keys)%s", among, list, prefixHint)
}

// recordsPlace is where the store keeps its records: "in table ..." or
// "under the key prefix ...".
func (g *globals) recordsPlace() string {
	switch g.store {
	case "postgres":
		return fmt.Sprintf("in table %s.%s (--pg-schema, --pg-table)", g.pgSchema, g.pgTable)
	case "mysql":
		return fmt.Sprintf("in table %s (--mysql-table)", g.mysqlTable)
	case "dynamodb":
		return fmt.Sprintf("in table %s (--dynamo-table)", g.dynamoTable)
	default:
		return fmt.Sprintf("under the key prefix %q (--redis-prefix)", g.redisPrefix)
	}
}
