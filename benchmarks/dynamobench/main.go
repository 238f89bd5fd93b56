// Command dynamobench measures the DynamoDB store against the floor of what
// it does: a loop of two raw conditional PutItem calls per key (create if
// absent, then overwrite if the owner matches), and a loop of the store's
// own two conditional UpdateItem calls sent raw, through the same client,
// at the same concurrency, on the same server, in one run. The store's
// cycle is Acquire and Complete.
//
//	go run ./dynamobench -endpoint http://127.0.0.1:8000 -clients 16 -duration 5s
//
// Against dynalite (make bench-dynamo starts one) this measures dynalite,
// a Node.js server on LevelDB, not DynamoDB: only the ratio carries over.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/watermill-idempotency/idempotency/backends/dynamostore"
	"github.com/watermill-idempotency/idempotency/benchmarks/internal/load"
)

func main() {
	endpoint := flag.String("endpoint", "http://127.0.0.1:8000", "DynamoDB endpoint")
	clients := flag.Int("clients", 16, "concurrent clients")
	duration := flag.Duration("duration", 5*time.Second, "duration of each run")
	rounds := flag.Int("rounds", 3, "rounds, alternating which goes first; medians are reported")
	ttl := flag.Bool("ttl", false, "turn Time to Live on for the store's table (dynalite has no UpdateTimeToLive)")
	flag.Parse()
	if err := run(*endpoint, *clients, *duration, *rounds, *ttl); err != nil {
		fmt.Fprintln(os.Stderr, "dynamobench:", err)
		os.Exit(1)
	}
}

func run(endpoint string, clients int, duration time.Duration, rounds int, ttl bool) error {
	ctx := context.Background()
	api := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "bench", SecretAccessKey: "bench"}, nil
		}),
		HTTPClient: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}},
	})
	opts := dynamostore.Options{Table: fmt.Sprintf("dynamobench_%d", time.Now().UnixNano()%1e9), TTL: dynamostore.TTLUntouched}
	if ttl {
		opts.TTL = dynamostore.TTLOn
	}
	store, err := dynamostore.New(api, opts)
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	table := aws.String(opts.Table)

	raw := func(ctx context.Context, key string) error {
		item := map[string]types.AttributeValue{
			"id":    &types.AttributeValueMemberB{Value: []byte(key)},
			"owner": &types.AttributeValueMemberS{Value: key},
			"state": &types.AttributeValueMemberN{Value: "1"},
		}
		if _, err := api.PutItem(ctx, &dynamodb.PutItemInput{TableName: table, Item: item,
			ConditionExpression: aws.String("attribute_not_exists(id)")}); err != nil {
			return err
		}
		item["state"] = &types.AttributeValueMemberN{Value: "3"}
		_, err := api.PutItem(ctx, &dynamodb.PutItemInput{TableName: table, Item: item,
			ConditionExpression:       aws.String("#o = :o"),
			ExpressionAttributeNames:  map[string]string{"#o": "owner"},
			ExpressionAttributeValues: map[string]types.AttributeValue{":o": item["owner"]},
		})
		return err
	}
	// The store's two writes as it sends them (its expressions, its
	// attributes), without the store: what dynalite charges for the richer
	// item and expressions, apart from the store's own work.
	names := map[string]string{"#id": "id", "#state": "state", "#owner": "owner", "#token": "token",
		"#attempt": "attempt", "#lease": "lease_ms", "#retention": "retention_ms", "#forget": "forget_ms",
		"#ttl": "ttl", "#ttl_after": "ttl_after_s", "#output": "output", "#completed": "completed_ms", "#fp": "fingerprint",
		"#acquired": "acquired_ms", "#origin": "origin"}
	num := func(n int64) types.AttributeValue { return &types.AttributeValueMemberN{Value: fmt.Sprint(n)} }
	updates := func(ctx context.Context, key string) error {
		now := time.Now().UnixMilli()
		k := map[string]types.AttributeValue{"id": &types.AttributeValueMemberB{Value: []byte(key)}}
		owner := &types.AttributeValueMemberS{Value: key}
		if _, err := api.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: table, Key: k,
			UpdateExpression: aws.String("SET #state = :one, #owner = :owner, #acquired = :now, #lease = :lease, #retention = :retention, #forget = :forget, " +
				"#ttl = :ttl, #ttl_after = :ttl_after, #token = if_not_exists(#token, :zero) + :one, #attempt = :one, #origin = :origin REMOVE #output, #completed, #fp"),
			ConditionExpression:      aws.String("attribute_not_exists(#id) OR #forget <= :old"),
			ExpressionAttributeNames: names,
			ExpressionAttributeValues: map[string]types.AttributeValue{":one": num(1), ":zero": num(0), ":owner": owner,
				":lease": num(now + 30000), ":retention": num(3600000), ":forget": num(now + 3630000), ":ttl": num(now/1000 + 3700),
				":ttl_after": num(3602), ":old": num(now - 1000), ":now": num(now), ":origin": &types.AttributeValueMemberS{Value: load.Origin(key)}},
			ReturnValues: types.ReturnValueAllNew, ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		}); err != nil {
			return err
		}
		_, err := api.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: table, Key: k,
			UpdateExpression:    aws.String("SET #state = :three, #completed = :now, #forget = :now + #retention, #ttl = :now_s + #ttl_after REMOVE #output"),
			ConditionExpression: aws.String("#owner = :owner AND #token = :token AND #state = :one AND #forget > :now"),
			ExpressionAttributeNames: map[string]string{"#state": "state", "#completed": "completed_ms", "#forget": "forget_ms",
				"#retention": "retention_ms", "#ttl": "ttl", "#ttl_after": "ttl_after_s", "#output": "output", "#owner": "owner", "#token": "token"},
			ExpressionAttributeValues: map[string]types.AttributeValue{":three": num(3), ":one": num(1), ":now": num(now),
				":now_s": num(now / 1000), ":owner": owner, ":token": num(1)},
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		return err
	}
	ours := load.StoreCycle(store)

	// Each round runs the three loops, in an order that rotates, so that
	// none always follows another.
	loops := []func(context.Context, string) error{raw, updates, ours}
	runs := make([][]float64, len(loops))
	lat := make([]time.Duration, len(loops))
	steps := make([]func() error, len(loops))
	for j, loop := range loops {
		steps[j] = func() error {
			v, err := load.Cycles(clients, duration, loop)
			runs[j] = append(runs[j], v)
			return err
		}
	}
	if err := load.Rounds(rounds, steps...); err != nil {
		return err
	}
	for i, loop := range loops {
		d, err := load.Sequential(200, loop)
		if err != nil {
			return err
		}
		lat[i] = d
	}

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "DynamoDB store benchmark against %s: %d clients, %v per run, median of %d rounds\n\n", endpoint, clients, duration, rounds)
	fmt.Fprintln(w, "\t2 conditional PutItems\tthe store's 2 UpdateItems, raw\tour Acquire+Complete\tours/PutItems\tours/raw UpdateItems\t")
	r, u, o := load.Median(runs[0]), load.Median(runs[1]), load.Median(runs[2])
	fmt.Fprintf(w, "throughput\t%.0f cycles/s\t%.0f cycles/s\t%.0f cycles/s\t%.3f\t%.3f\t\n", r, u, o, o/r, o/u)
	fmt.Fprintf(w, "one client, median\t%v\t%v\t%v\t%.3f\t%.3f\t\n", lat[0].Round(time.Microsecond), lat[1].Round(time.Microsecond),
		lat[2].Round(time.Microsecond), float64(lat[2])/float64(lat[0]), float64(lat[2])/float64(lat[1]))
	return w.Flush()
}
