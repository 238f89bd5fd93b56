// Command idem inspects and repairs the records of the idempotency
// middleware's stores: Redis (single node or Cluster), Postgres, MySQL or
// MariaDB, and DynamoDB.
//
//	idem inspect [flags] KEY...          state, owner, token, time left, stored output
//	idem release [flags] KEY             give up a stuck lease (only the one inspected)
//	idem complete [flags] KEY [--force]  mark as handled: the next delivery is dropped
//	idem delete [flags] KEY [--force]    forget the key: the next delivery runs
//	idem list [flags] [--namespace H] [--state S] [--limit N] [--cursor C]
//	idem stats [flags] [--namespace H]   records by state
//	idem key --json-field F | --metadata N | --uuid | --payload-hash [--namespace H] [--inspect] < payload
//	idem pg migrate | schema | cleanup [flags] [--batch N]
//	idem mysql migrate | schema | cleanup [flags] [--batch N]
//	idem dynamodb create-table [flags] [--no-ttl]
//	idem version                         the version idem was built from
//
// The store is chosen with --store redis|postgres|mysql|dynamodb and
// reached with --redis-url (or --redis-cluster) and --redis-prefix;
// --pg-url, --pg-schema and --pg-table; --mysql-dsn (a go-sql-driver DSN,
// user:password@tcp(host:3306)/db) and --mysql-table; or --dynamo-table,
// --dynamo-clock-skew and, for LocalStack or dynalite, --dynamo-endpoint,
// with the region and credentials from the AWS environment and config
// files (AWS_REGION, AWS_PROFILE...). Each flag defaults to its IDEM_*
// environment variable. Without --store, idem takes postgres if --pg-url
// is set, mysql if --mysql-dsn is, else redis. -o json prints JSON.
//
// Exit codes: 0 done, 1 error, 2 key not found, 3 refused (the record
// changed since it was inspected, or a live lease needs --force).
package main
