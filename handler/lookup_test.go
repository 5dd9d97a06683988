package handler_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
)

func TestLeaseHandlerLookup(t *testing.T) {
	t.Parallel()
	proc, err := txhook.NewProcessor(stubBeginner{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	work := func(context.Context, txhook.Claim, txhook.Event) (txhook.TxFunc, error) { return nil, nil }
	ep, err := handler.New(proc, &handler.Config{
		Source:   "s",
		Provider: &handler.Stripe{Secrets: []string{"x"}},
		Routes: map[string]handler.Route{
			"tx":    handler.Tx(func(context.Context, pgx.Tx, txhook.Event) error { return nil }),
			"lease": handler.Lease(txhook.LeaseHandler{Work: work, Lease: 42 * time.Second}),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if h, ok := ep.LeaseHandler("lease"); !ok || h.Lease != 42*time.Second || h.Work == nil {
		t.Errorf("LeaseHandler(lease) = %+v, %v; want the registered handler", h, ok)
	}
	if _, ok := ep.LeaseHandler("tx"); ok {
		t.Error("LeaseHandler(tx): a transactional route was returned")
	}
	if _, ok := ep.LeaseHandler("zzz"); ok {
		t.Error("LeaseHandler(zzz): found without a route")
	}
	if _, ok := ep.TxHandler("lease"); ok {
		t.Error("TxHandler(lease): a lease route was returned")
	}
}
