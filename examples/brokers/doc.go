// Package brokers holds the end-to-end tests that tell one story (package
// story) on the Watermill brokers without a runnable example here: AMQP,
// NATS JetStream, Google Pub/Sub and SQL on Postgres and MariaDB (Redis
// Streams', SQS's and Kafka's are in the redis, sqs and kafka examples),
// each with its leases in Redis and in Postgres.
package brokers
