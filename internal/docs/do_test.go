package docs

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/watermill-idempotency/idempotency/backends/memstore"
)

// snippet:do
import (
	"time"

	"github.com/watermill-idempotency/idempotency/backends/pgstore"
	idempotency "github.com/watermill-idempotency/idempotency/middleware"
)

// end snippet

var _ = nightlyInvoices

type Invoice struct {
	Customer string
	Total    int64
}

func billCustomer(ctx context.Context, customer string, fence int64) (Invoice, error) {
	return Invoice{Customer: customer, Total: 1200}, nil
}

func nightlyInvoices(ctx context.Context, store *pgstore.Store, customers []string, day string) error {
	// snippet:do
	idem, err := idempotency.New(idempotency.Config{
		Store:     store,              // any store: pgstore, redisstore, mysqlstore, dynamostore, memstore
		Namespace: "invoices",         // required for Do: the key space
		LeaseTTL:  2 * time.Minute,    // renewed while the function runs
		Retention: 7 * 24 * time.Hour, // how long a done key is remembered
	})
	if err != nil {
		return err
	}
	for _, customer := range customers {
		// A cron that fires twice, or a job retried after a crash, bills
		// each customer once a day: the second call gets the first one's
		// invoice back without running the function.
		inv, err := idempotency.Do(ctx, idem, day+"/"+customer, func(ctx context.Context) (Invoice, error) {
			lease, _ := idempotency.LeaseFromContext(ctx)
			return billCustomer(ctx, customer, lease.Token) // the fencing token, for the billing system
		})
		var inProgress *idempotency.InProgressError
		switch {
		case errors.As(err, &inProgress):
			continue // another run bills this customer right now
		case err != nil:
			return err // the function failed, or the store: the key was released, run again later
		}
		fmt.Println("billed", inv.Customer, inv.Total)
	}
	// end snippet
	return nil
}

// TestDoSnippet runs the snippet's calls on memstore: once per key.
func TestDoSnippet(t *testing.T) {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	idem, err := idempotency.New(idempotency.Config{Store: store, Namespace: "invoices"})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	for range 3 {
		inv, err := idempotency.Do(t.Context(), idem, "2026-11-28/acme", func(ctx context.Context) (Invoice, error) {
			runs++
			return billCustomer(ctx, "acme", 0)
		})
		if err != nil || inv.Customer != "acme" {
			t.Fatalf("Do: %v, %v", inv, err)
		}
	}
	if runs != 1 {
		t.Fatalf("the function ran %d times", runs)
	}
}
