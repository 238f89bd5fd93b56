package awssqs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/watermill-idempotency/idempotency/backends/storekit"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// ReceiptHandleKey is the metadata key under which [Unmarshaler] records a
// message's receipt handle, until [Defer] takes it out.
const ReceiptHandleKey = "_idempotency_sqs_receipt_handle"

// MaxVisibilityTimeout is the longest visibility SQS accepts: 12 hours.
const MaxVisibilityTimeout = 12 * time.Hour

// Unmarshaler wraps a watermill-aws unmarshaler and records each message's
// receipt handle in its metadata.
type Unmarshaler struct {
	// Inner unmarshals the message. Defaults to the watermill-aws default.
	Inner wsqs.Unmarshaler
}

// Unmarshal implements wsqs.Unmarshaler.
func (u Unmarshaler) Unmarshal(m *types.Message) (*message.Message, error) {
	inner := u.Inner
	if inner == nil {
		inner = wsqs.DefaultMarshalerUnmarshaler{}
	}
	msg, err := inner.Unmarshal(m)
	if err != nil || msg == nil {
		return msg, err
	}
	if m.ReceiptHandle != nil {
		if msg.Metadata == nil {
			msg.Metadata = message.Metadata{}
		}
		msg.Metadata.Set(ReceiptHandleKey, *m.ReceiptHandle)
	}
	return msg, nil
}

var _ wsqs.Unmarshaler = Unmarshaler{}

// Client is what [Defer] needs from the SQS client: a *sqs.Client.
type Client interface {
	ChangeMessageVisibility(ctx context.Context, in *sqs.ChangeMessageVisibilityInput, optFns ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error)
	GetQueueUrl(ctx context.Context, in *sqs.GetQueueUrlInput, optFns ...func(*sqs.Options)) (*sqs.GetQueueUrlOutput, error)
}

// DeferConfig configures [Defer].
type DeferConfig struct {
	// Client changes the visibility and looks queues up. Required.
	Client Client
	// QueueURL returns the queue URL for the topic the message was received
	// from. Defaults to looking up the queue named as the topic (the
	// watermill-aws default) with Client, cached; set it if your
	// subscriber maps topics to queues otherwise.
	QueueURL func(ctx context.Context, topic string) (string, error)
	// MaxDelay caps the visibility set. Defaults to MaxVisibilityTimeout.
	MaxDelay time.Duration
	// Logger reports failures to change the visibility (the message then
	// reappears after the queue's visibility timeout, as without Defer).
	// Defaults to watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

// ErrInvalidConfig is wrapped by every error [NewDefer] returns.
var ErrInvalidConfig = errors.New("awssqs: invalid config")

// Defer is the middleware. Create it with [NewDefer].
type Defer struct {
	cfg DeferConfig
}

// NewDefer returns the middleware for cfg, or an error wrapping
// [ErrInvalidConfig]. cfg is not modified.
func NewDefer(cfg DeferConfig) (*Defer, error) {
	if storekit.IsNil(cfg.Client) {
		return nil, fmt.Errorf("%w: Client is required", ErrInvalidConfig)
	}
	if cfg.QueueURL == nil {
		client := cfg.Client
		var cache sync.Map // topic -> URL
		cfg.QueueURL = func(ctx context.Context, topic string) (string, error) {
			if url, ok := cache.Load(topic); ok {
				return url.(string), nil
			}
			res, err := client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(topic)})
			if err != nil {
				return "", fmt.Errorf("awssqs: queue %s: %w", topic, err)
			}
			url := aws.ToString(res.QueueUrl)
			cache.Store(topic, url)
			return url, nil
		}
	}
	if cfg.MaxDelay == 0 {
		cfg.MaxDelay = MaxVisibilityTimeout
	}
	if cfg.MaxDelay < time.Second || cfg.MaxDelay > MaxVisibilityTimeout {
		return nil, fmt.Errorf("%w: MaxDelay must be between 1s and %v, got %v", ErrInvalidConfig, MaxVisibilityTimeout, cfg.MaxDelay)
	}
	if cfg.Logger == nil {
		cfg.Logger = watermill.NopLogger{}
	}
	return &Defer{cfg: cfg}, nil
}

// Middleware takes the receipt handle out of the message, runs h, and if h
// reports the key in progress ([idempotency.InProgressError]), makes the message visible again
// when the holder's lease runs out. h's result is returned unchanged.
func (d *Defer) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		handle := msg.Metadata.Get(ReceiptHandleKey)
		delete(msg.Metadata, ReceiptHandleKey)
		out, err := h(msg)
		var ipe *idempotency.InProgressError
		if handle != "" && errors.As(err, &ipe) {
			d.delay(msg, handle, ipe.Remaining)
		}
		return out, err
	}
}

func (d *Defer) delay(msg *message.Message, handle string, remaining time.Duration) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), 5*time.Second)
	defer cancel()
	seconds := int32(math.Ceil(min(max(remaining, time.Second), d.cfg.MaxDelay).Seconds()))
	fields := watermill.LogFields{"message_uuid": msg.UUID, "visibility_seconds": seconds}
	topic := message.SubscribeTopicFromCtx(msg.Context())
	url, err := d.cfg.QueueURL(ctx, topic)
	if err == nil {
		_, err = d.cfg.Client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
			QueueUrl: aws.String(url), ReceiptHandle: aws.String(handle), VisibilityTimeout: seconds,
		})
	}
	if err != nil {
		d.cfg.Logger.Error("awssqs: cannot delay the in-progress message", err, fields)
		return
	}
	d.cfg.Logger.Debug("awssqs: in-progress message delayed until the holder's lease runs out", fields)
}
