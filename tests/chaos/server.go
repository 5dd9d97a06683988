package main

import (
	"context"
	"slices"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/childproc"
)

// The receivers a chaos run can drive, built once and run as child
// processes so that a kill is a real process death: the stripe-orders
// example, and the naive dedupe the demo shows losing events (to see the
// run's check catch a receiver that loses events).
const (
	stripeOrdersPkg  = "github.com/txhook/txhook/examples/stripe-orders"
	naiveReceiverPkg = "github.com/txhook/txhook/cmd/demo/naivereceiver"
)

// naiveReceiverModule and naiveReceiverDir are where the naive receiver is
// built: in the demo's module, a module of its own.
const (
	naiveReceiverModule = "cmd/demo"
	naiveReceiverDir    = "./naivereceiver"
)

// launcher starts the example with a fixed environment on a fixed address.
type launcher struct {
	bin  string
	addr string
	env  []string
	log  *childproc.Output
}

// start runs the example, with TXHOOK_CRASH_POINT set to crashPoint when it
// is not empty, and waits until it accepts connections, exits, or 60s pass.
func (l *launcher) start(ctx context.Context, crashPoint string) (*childproc.Process, error) {
	env := append(slices.Clone(l.env), "ADDR="+l.addr)
	if crashPoint != "" {
		env = append(env, txhook.CrashPointEnv+"="+crashPoint)
	}
	return childproc.Start(ctx, childproc.Spec{
		Name:   "example",
		Bin:    l.bin,
		Env:    childproc.Env(env...),
		Addr:   l.addr,
		Output: l.log,
	})
}
