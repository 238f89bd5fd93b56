module github.com/watermill-idempotency/idempotency/examples

go 1.26.0

require (
	github.com/ThreeDotsLabs/watermill v1.5.3
	github.com/watermill-idempotency/idempotency v0.0.0
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/lithammer/shortuuid/v3 v3.0.7 // indirect
	github.com/oklog/ulid v1.3.1 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/tidwall/gjson v1.18.0 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.2.0 // indirect
)

replace github.com/watermill-idempotency/idempotency => ../
