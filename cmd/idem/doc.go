// Command idem inspects and repairs the records of the idempotency
// middleware's stores: Redis (single node or Cluster), Postgres, MySQL or
// MariaDB, and DynamoDB.
//
//	idem inspect [flags] KEY...          state, owner, token, time left, stored output
//	idem release [flags] KEY             give up a stuck lease (only the one inspected)
//	idem complete [flags] KEY [--force] [--create]  mark as handled: the next delivery is dropped
//	idem delete [flags] KEY [--force]    forget the key: the next delivery runs
//	idem list [flags] [--namespace H] [--state S] [--limit N] [--cursor C]
//	idem stats [flags] [--namespace H]   records by state
//	idem key --namespace H (--json-field NAME... | --metadata N | --uuid | --payload-hash) [--inspect] < payload
//	idem pg migrate | schema | cleanup [flags] [--batch N]
//	idem mysql migrate | schema | cleanup [flags] [--batch N]
//	idem dynamodb migrate [flags] [--ttl on|untouched]
//	idem version                         the version idem was built from, or (devel) and the commit
//
// The store is chosen with --store redis|postgres|mysql|dynamodb and
// reached with --redis-url (or --redis-cluster: host:port,..., or a
// redis:// URL for a user and password) and --redis-prefix;
// --pg-url, --pg-schema and --pg-table; --mysql-dsn (a go-sql-driver DSN,
// user:password@tcp(host:3306)/db) and --mysql-table; or --dynamo-table,
// --dynamo-clock-skew and, for LocalStack or dynalite, --dynamo-endpoint,
// with the region and credentials from the AWS environment and config
// files (AWS_REGION, AWS_PROFILE...). Every flag defaults to its
// environment variable: IDEM_ and its name in capitals, dashes as
// underscores (--redis-url: IDEM_REDIS_URL). Without --store, idem takes
// postgres if --pg-url is set, mysql if --mysql-dsn is, else redis.
// --timeout bounds the whole command, every store call included. No
// output holds a password of these flags or of the AWS environment. -o json
// prints JSON; release, complete and delete then print an action, one of
// released, completed, already_completed, deleted, not_found, in_progress,
// no_lease and changed.
//
// Exit codes: 0 done, 1 error (a usage error, or a store that does not
// answer or answers with an error), 2 key not found, 3 refused (the record
// changed since it was inspected, a key in progress needs --force, or there is
// no lease to release).
package main
