package docs

import (
	"context"
	"errors"
	"fmt"

	"github.com/watermill-idempotency/idempotency/backends"
)

var _, _, _ = inspect, deleteKey, list

func inspect(ctx context.Context, store backends.Store) error {
	// snippet:inspect
	rec, err := store.Inspect(ctx, "charge-order:order-42")
	if errors.Is(err, backends.ErrNotFound) {
		return nil // never seen, or its retention has passed
	}
	if err != nil {
		return err
	}
	fmt.Println(rec.State, rec.Owner, rec.Token, rec.Attempt, rec.LeaseExpiresAt, rec.CompletedAt, rec.ExpiresAt)
	// Which delivery took the lease (for a completed record, which message
	// completed the key: "message_uuid=<uuid> handler=<name>"), and when.
	fmt.Println(rec.Origin, rec.AcquiredAt)

	// The messages a duplicate of a completed key gets replayed:
	out, err := backends.DecodeOutput(rec.Output)
	if err != nil {
		return err
	}
	for _, msg := range out {
		fmt.Println(msg.UUID, msg.Metadata, len(msg.Payload))
	}
	// end snippet
	return nil
}

func deleteKey(ctx context.Context, store backends.Store) error {
	// snippet:delete
	err := store.Delete(ctx, "charge-order:order-42")
	// end snippet
	return err
}

func list(ctx context.Context, store backends.Store) error {
	// snippet:list
	lister := store.(backends.Lister)
	req := backends.ListRequest{Namespace: "charge-order", State: backends.StateInProgress, Limit: 100}
	for {
		page, err := lister.List(ctx, req)
		if err != nil {
			return err
		}
		for _, rec := range page.Records {
			fmt.Println(rec.Key, rec.Owner, rec.Token, rec.LeaseExpiresAt)
		}
		if page.Cursor == "" {
			break
		}
		req.Cursor = page.Cursor
	}
	// end snippet
	return nil
}
