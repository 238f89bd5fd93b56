package brokers_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/mysqlstore"
	"github.com/watermill-idempotency/idempotency/examples/internal/story"
	"github.com/watermill-idempotency/idempotency/examples/internal/testenv"
)

// sqlTopic is a topic name watermill-sql can make table names of.
func sqlTopic() string {
	return strings.NewReplacer("-", "_", ":", "").Replace(testenv.Unique("orders_"))
}

// sqlBroker is watermill-sql on db. A consumer group reads a topic one
// message at a time (its offset row is locked while a message is
// handled), so each consumer here has its own consumer group with the same
// handler (two deployments sharing the lease store): every message is
// delivered to both, and the in-flight duplicate comes from the other
// group. A nack is resent after ResendInterval.
func sqlBroker(t *testing.T, name string, db wmsql.Beginner, schema wmsql.SchemaAdapter, offsets wmsql.OffsetsAdapter, drop func(topic string)) story.Broker {
	logger := watermill.NopLogger{}
	topic := sqlTopic()
	pub, err := wmsql.NewPublisher(db, wmsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { drop(topic) })
	return story.Broker{
		Name:      name,
		Publisher: pub,
		Topic:     topic,
		Subscriber: func(consumer string) (message.Subscriber, error) {
			sub, err := wmsql.NewSubscriber(db, wmsql.SubscriberConfig{
				ConsumerGroup:    consumer,
				SchemaAdapter:    schema,
				OffsetsAdapter:   offsets,
				InitializeSchema: true,
				PollInterval:     50 * time.Millisecond,
				ResendInterval:   100 * time.Millisecond,
			}, logger)
			if err == nil {
				t.Cleanup(func() { _ = sub.Close() })
			}
			return sub, err
		},
		DeliveriesPerMessage: 2,
	}
}

func TestSQLPostgres(t *testing.T) {
	story.Tell(t, func(t *testing.T) story.Broker {
		pool := testenv.PostgresPool(t)
		return sqlBroker(t, "SQL on Postgres", wmsql.BeginnerFromPgx(pool),
			wmsql.DefaultPostgreSQLSchema{}, wmsql.DefaultPostgreSQLOffsetsAdapter{},
			func(topic string) {
				_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS "watermill_`+topic+`", "watermill_offsets_`+topic+`"`)
			})
	})
}

func TestSQLMariaDB(t *testing.T) {
	story.Tell(t, func(t *testing.T) story.Broker {
		cfg, err := mysql.ParseDSN(testenv.Service(t, "MYSQL_DSN"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.ParseTime = true // watermill-sql's MySQL schema reads times
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := db.PingContext(ctx); err != nil {
			t.Fatalf("MariaDB (MYSQL_DSN): %v", err)
		}
		b := sqlBroker(t, "SQL on MariaDB", wmsql.BeginnerFromStdSQL(db),
			wmsql.DefaultMySQLSchema{}, wmsql.DefaultMySQLOffsetsAdapter{},
			func(topic string) {
				_, _ = db.Exec("DROP TABLE IF EXISTS `watermill_" + topic + "`, `watermill_offsets_" + topic + "`")
			})
		// On MySQL/MariaDB the subscribers' row locks hold every consumer
		// group of the topic while one message is handled: no duplicate
		// arrives while the slow order runs, and a slow handler stalls the
		// topic for everyone.
		b.Serialized = true
		return b
	}, story.Store{Name: "mysql", New: mysqlStore})
}

// mysqlStore is the story's store on the same MariaDB as the broker: the
// leases next to the messages, in a table of the test's own.
func mysqlStore(t testing.TB) backends.Store {
	db, err := sql.Open("mysql", testenv.Service(t, "MYSQL_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	table := strings.NewReplacer("-", "_", ":", "").Replace(testenv.Unique("story_"))
	s, err := mysqlstore.New(db, mysqlstore.Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("MariaDB (MYSQL_DSN): %v", err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS `" + table + "`") })
	return s
}
