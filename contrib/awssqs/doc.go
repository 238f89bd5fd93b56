// Package awssqs makes the idempotency middleware's "try later" SQS-aware,
// for watermill-aws subscribers.
//
// watermill-aws's Nack does nothing: a nacked message reappears after the
// queue's visibility timeout. For a duplicate whose key is in progress
// (held by the live lease of another delivery), that redelivery may come
// too early (the holder is still running, so it is nacked again, and
// every receive counts towards the queue's maxReceiveCount) or needlessly
// late. [Defer] sets such a
// message's visibility to the holder's remaining lease instead, so the
// redelivery comes when it can succeed.
//
// It needs each message's receipt handle, which watermill-aws's default
// unmarshaler does not expose: wrap the subscriber's unmarshaler in
// [Unmarshaler]. [Defer] removes the receipt handle from the message's
// metadata before any handler sees it, so it never leaks into messages
// the handler produces or into a poison queue.
//
//	sub, err := sqs.NewSubscriber(sqs.SubscriberConfig{
//		AWSConfig:   cfg,
//		Unmarshaler: awssqs.Unmarshaler{},
//	}, logger)
//	if err != nil {
//		return err
//	}
//	deferrer, err := awssqs.NewDefer(awssqs.DeferConfig{Client: sqsClient}) // a *sqs.Client
//	if err != nil {
//		return err
//	}
//	router.AddMiddleware(poisonQueue, deferrer.Middleware, idem.Middleware)
//
// It lives in its own module so that the core library does not depend on
// the AWS SDK.
package awssqs
