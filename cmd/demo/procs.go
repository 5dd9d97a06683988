package main

import (
	"context"
	"time"

	"github.com/txhook/txhook/internal/childproc"
)

// Packages the demo builds and runs as separate processes, so that a crash
// is a real process exit. The stripe-orders example is built in its own
// module (stripeOrdersDir, from the repository's root), with its own
// dependencies.
const (
	stripeOrdersPkg  = "github.com/txhook/txhook/examples/stripe-orders"
	stripeOrdersDir  = "examples/stripe-orders"
	naiveReceiverPkg = "github.com/txhook/txhook/cmd/demo/naivereceiver"
)

// server is a receiver running as a child process.
type server struct {
	*childproc.Process
	name string
	addr string
	log  *childproc.Output // everything it printed
}

// startServer runs bin with env added to the demo's environment and waits
// until it accepts connections on addr, or exits.
func startServer(ctx context.Context, name, bin, addr string, env ...string) (*server, error) {
	log := &childproc.Output{}
	p, err := childproc.Start(ctx, childproc.Spec{
		Name:   name,
		Bin:    bin,
		Env:    childproc.Env(append(env, "ADDR="+addr)...),
		Addr:   addr,
		Output: log,
		Tail:   log,
	})
	if err != nil {
		return nil, err
	}
	return &server{Process: p, name: name, addr: addr, log: log}, nil
}

// stop asks the server to shut down and waits for it, killing it if it does
// not stop within 10s.
func (s *server) stop() { s.Stop(10 * time.Second) }
