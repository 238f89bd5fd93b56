package docs

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// snippet:chain
import (
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// end snippet

var _ = chain

func chain(router *message.Router, pub message.Publisher, idem *idempotency.Idempotency) error {
	// snippet:chain
	// Only messages that can never succeed go to the poison queue. A plain
	// PoisonQueue would also ack duplicates whose key is in progress, store
	// errors and lost leases, and a message whose holder then fails would be
	// gone.
	poisonQueue, err := middleware.PoisonQueueWithFilter(pub, "orders.poison", idempotency.IsPoison)
	if err != nil {
		return err
	}
	// Retries every handler error but one that can never succeed
	// (idempotency.Permanent, and the rest of IsPoison).
	retry := middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond, ShouldRetry: idempotency.ShouldRetry}

	router.AddMiddleware(
		poisonQueue,      // outermost: sees *KeyError, ErrFingerprintMismatch, ErrOutputTooLarge, Permanent errors
		idem.Middleware,  // one lease for the whole delivery, retries included
		retry.Middleware, // retries the handler within that lease
	)
	// end snippet
	return nil
}

var _ = handler

type order struct {
	ID string `json:"order_id"`
}

func charge(*message.Message, order) error { return nil }

func handler(msg *message.Message) error {
	// snippet:permanent
	var o order
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		// No redelivery will parse it: to the poison queue, once.
		return idempotency.Permanent(fmt.Errorf("order %s: %w", msg.UUID, err))
	}
	return charge(msg, o) // any other error is retried
	// end snippet
}
