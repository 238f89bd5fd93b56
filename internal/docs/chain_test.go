package docs

import (
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
	retry := middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond}

	router.AddMiddleware(
		poisonQueue,      // outermost: sees *KeyError, ErrFingerprintMismatch, ErrOutputTooLarge
		idem.Middleware,  // one lease for the whole delivery, retries included
		retry.Middleware, // retries the handler within that lease
	)
	// end snippet
	return nil
}
