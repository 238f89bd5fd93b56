// Command recordsize measures the bytes one record takes in each store:
// the record of a message the middleware handled with its defaults
// (lease TTL 30 s, retention 24 h), with a UUID as its key under the
// handler's name, the middleware's owner token and origin
// ("message_uuid=<uuid> handler=charge-order", 70 bytes), no fingerprint
// and no output, in progress and completed.
//
//   - Redis: MEMORY USAGE of the key (SAMPLES 0), the mean of -n records.
//   - Postgres: pg_column_size of the row (its data, without the tuple's
//     23-byte header and 4-byte line pointer), and the table's heap and
//     indexes (pg_relation_size, pg_indexes_size) per row after -n
//     completed records and VACUUM FULL, which packs them at the table's
//     fillfactor.
//   - MariaDB or MySQL: the clustered index (DATA_LENGTH) and the forget_us
//     index (INDEX_LENGTH) per row after -n completed records and OPTIMIZE
//     TABLE, and AVG_ROW_LENGTH.
//   - DynamoDB: the item's size by AWS's rule (the UTF-8 bytes of each
//     attribute's name, plus a string's UTF-8 bytes, a binary's bytes, or a
//     number's significant digits halved, rounded up, plus one), which
//     capacity units and the 400 KB limit count.
//
// A store whose flag is empty is skipped.
//
//	go run ./recordsize -redis 127.0.0.1:6379 -pg postgres://... -mysql 'root@tcp(...)/test' -dynamo http://127.0.0.1:8000
package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"flag"
	"fmt"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/dynamostore"
	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	"github.com/watermill-idempotency/idempotency/backends/redisstore"
)

// handler is the handler's name: the namespace of its keys and part of
// the origin.
const handler = "charge-order"

func main() {
	redisAddr := flag.String("redis", "", "Redis address")
	pgURL := flag.String("pg", "", "Postgres URL")
	mysqlDSN := flag.String("mysql", "", "MariaDB or MySQL DSN")
	dynamo := flag.String("dynamo", "", "DynamoDB endpoint")
	n := flag.Int("n", 20000, "completed records for the table sizes (Postgres, MySQL); a hundredth of them for Redis and DynamoDB")
	flag.Parse()
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "record of a message, origin of %d bytes\tin progress\tcompleted\t\n", len(origin(watermill.NewUUID())))
	ctx := context.Background()
	for _, m := range []struct {
		name string
		arg  string
		fn   func(context.Context, string, int, *tabwriter.Writer) error
	}{
		{"redis", *redisAddr, measureRedis},
		{"postgres", *pgURL, measurePostgres},
		{"mysql", *mysqlDSN, measureMySQL},
		{"dynamodb", *dynamo, measureDynamo},
	} {
		if m.arg == "" {
			continue
		}
		if err := m.fn(ctx, m.arg, *n, w); err != nil {
			fmt.Fprintf(os.Stderr, "recordsize: %s: %v\n", m.name, err)
			os.Exit(1)
		}
	}
	_ = w.Flush()
}

// origin is the middleware's origin of a delivery of message uuid to the
// handler.
func origin(uuid string) string { return "message_uuid=" + uuid + " handler=" + handler }

var (
	ownerPrefix = func() string {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		return hex.EncodeToString(b) + "-"
	}()
	ownerSeq atomic.Uint64
)

// owner is an owner token as the middleware makes them.
func owner() string { return ownerPrefix + strconv.FormatUint(ownerSeq.Add(1)+1_000_000, 36) }

// record makes the record of one message in s and returns its key, in
// progress or, if complete, completed.
func record(ctx context.Context, s backends.Store, complete bool) (string, error) {
	uuid := watermill.NewUUID()
	key := handler + ":" + uuid
	res, err := s.Acquire(ctx, backends.AcquireRequest{Key: key, Owner: owner(), LeaseTTL: 30 * time.Second,
		Retention: 24 * time.Hour, Origin: origin(uuid)})
	if err != nil {
		return "", err
	}
	if res.Status != backends.StatusAcquired {
		return "", fmt.Errorf("key %s: %v", key, res.Status)
	}
	if complete {
		return key, s.Complete(ctx, res.Lease, nil)
	}
	return key, nil
}

// records makes n completed records in s, from 16 goroutines.
func records(ctx context.Context, s backends.Store, n int) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if _, err := record(ctx, s, true); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// mean returns the mean of f over n records of each state.
func mean(ctx context.Context, s backends.Store, n int, f func(key string) (float64, error)) (inProgress, completed float64, err error) {
	for _, complete := range []bool{false, true} {
		var sum float64
		for range n {
			key, err := record(ctx, s, complete)
			if err != nil {
				return 0, 0, err
			}
			v, err := f(key)
			if err != nil {
				return 0, 0, err
			}
			sum += v
		}
		if complete {
			completed = sum / float64(n)
		} else {
			inProgress = sum / float64(n)
		}
	}
	return inProgress, completed, nil
}

func measureRedis(ctx context.Context, addr string, n int, w *tabwriter.Writer) error {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	prefix := fmt.Sprintf("recordsize:%d:", time.Now().UnixNano())
	defer func() {
		keys, _ := c.Keys(ctx, prefix+"*").Result()
		for len(keys) > 0 {
			batch := keys[:min(len(keys), 1000)]
			keys = keys[len(batch):]
			c.Unlink(ctx, batch...)
		}
	}()
	s, err := redisstore.New(c, redisstore.Options{Prefix: prefix})
	if err != nil {
		return err
	}
	p, done, err := mean(ctx, s, max(n/100, 1), func(key string) (float64, error) {
		v, err := c.MemoryUsage(ctx, prefix+key, 0).Result()
		return float64(v), err
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "Redis: MEMORY USAGE\t%.0f B\t%.0f B\t\n", p, done)
	return nil
}

func measurePostgres(ctx context.Context, url string, n int, w *tabwriter.Writer) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema := fmt.Sprintf("recordsize_%d", time.Now().UnixNano()%1e9)
	defer pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) //nolint:errcheck
	s, err := pgstore.New(pool, pgstore.Options{Schema: schema, Wake: pgstore.WakePoll})
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		return err
	}
	table := pgx.Identifier{schema, pgstore.DefaultTable}.Sanitize()
	p, done, err := mean(ctx, s, max(n/100, 1), func(key string) (float64, error) {
		var size float64
		err := pool.QueryRow(ctx, `SELECT pg_column_size(t.*) FROM `+table+` AS t WHERE key = $1`, []byte(key)).Scan(&size)
		return size, err
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "Postgres: pg_column_size(t.*)\t%.0f B\t%.0f B\t\n", p, done)
	if _, err := pool.Exec(ctx, `TRUNCATE `+table); err != nil {
		return err
	}
	if err := records(ctx, s, n); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `VACUUM FULL `+table); err != nil {
		return err
	}
	var heap, indexes float64
	if err := pool.QueryRow(ctx, `SELECT pg_relation_size($1::regclass), pg_indexes_size($1::regclass)`, table).Scan(&heap, &indexes); err != nil {
		return err
	}
	fmt.Fprintf(w, "Postgres: heap per completed row (fillfactor 80)\t\t%.0f B\t\n", heap/float64(n))
	fmt.Fprintf(w, "Postgres: indexes per completed row\t\t%.0f B\t\n", indexes/float64(n))
	return nil
}

func measureMySQL(ctx context.Context, dsn string, n int, w *tabwriter.Writer) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(16)
	table := fmt.Sprintf("recordsize_%d", time.Now().UnixNano()%1e9)
	defer db.Exec("DROP TABLE IF EXISTS `" + table + "`") //nolint:errcheck
	s, err := mysqlstore.New(db, mysqlstore.Options{Table: table})
	if err != nil {
		return err
	}
	if err := s.Migrate(ctx); err != nil {
		return err
	}
	if err := records(ctx, s, n); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, "OPTIMIZE TABLE `"+table+"`"); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, "ANALYZE TABLE `"+table+"`"); err != nil {
		return err
	}
	var data, index, avg float64
	if err := db.QueryRowContext(ctx, "SELECT DATA_LENGTH, INDEX_LENGTH, AVG_ROW_LENGTH FROM information_schema.TABLES"+
		" WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?", table).Scan(&data, &index, &avg); err != nil {
		return err
	}
	fmt.Fprintf(w, "MySQL: clustered index (DATA_LENGTH) per completed row\t\t%.0f B\t\n", data/float64(n))
	fmt.Fprintf(w, "MySQL: forget_us index (INDEX_LENGTH) per completed row\t\t%.0f B\t\n", index/float64(n))
	fmt.Fprintf(w, "MySQL: AVG_ROW_LENGTH\t\t%.0f B\t\n", avg)
	return nil
}

func measureDynamo(ctx context.Context, endpoint string, n int, w *tabwriter.Writer) error {
	api := dynamodb.New(dynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "recordsize", SecretAccessKey: "recordsize"}, nil
		}),
		HTTPClient: &http.Client{},
	})
	table := fmt.Sprintf("recordsize_%d", time.Now().UnixNano()%1e9)
	s, err := dynamostore.New(api, dynamostore.Options{Table: table, TTL: dynamostore.TTLUntouched})
	if err != nil {
		return err
	}
	if err := s.Migrate(ctx); err != nil {
		return err
	}
	defer api.DeleteTable(context.WithoutCancel(ctx), &dynamodb.DeleteTableInput{TableName: aws.String(table)}) //nolint:errcheck
	p, done, err := mean(ctx, s, max(n/100, 1), func(key string) (float64, error) {
		out, err := api.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true),
			Key: map[string]types.AttributeValue{"id": &types.AttributeValueMemberB{Value: []byte(key)}}})
		if err != nil {
			return 0, err
		}
		return float64(itemSize(out.Item)), nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "DynamoDB: item size (AWS's rule)\t%.0f B\t%.0f B\t\n", p, done)
	return nil
}

// itemSize is an item's size by AWS's rule for the types the store
// writes (S, N, B).
func itemSize(item map[string]types.AttributeValue) int {
	size := 0
	for name, v := range item {
		size += len(name)
		switch v := v.(type) {
		case *types.AttributeValueMemberS:
			size += len(v.Value)
		case *types.AttributeValueMemberB:
			size += len(v.Value)
		case *types.AttributeValueMemberN:
			size += numberSize(v.Value)
		}
	}
	return size
}

// numberSize is a number's size: its significant digits, halved and
// rounded up, plus one byte.
func numberSize(n string) int {
	digits := strings.Trim(strings.NewReplacer("-", "", ".", "").Replace(n), "0")
	return int(math.Ceil(float64(len(digits))/2)) + 1
}
