package handler_test

import (
	"sync"
	"testing"
	"time"
)

// waitBound bounds every wait of these tests: for an answer, for a held
// delivery to start or to finish. Nothing a test waits for takes near as
// long, so a wait that outlasts it (a lock wait left unbounded, a delivery
// never released) fails the test instead of hanging the package.
const waitBound = 5 * time.Second

// released is a channel that free closes, at the latest when the test ends.
type released struct {
	ch   chan struct{}
	once sync.Once
}

// newReleased returns a released channel; t.Cleanup closes it, so that a
// handler waiting on it (and holding a key, a lock or a connection
// meanwhile) ends with the test even when the test fails first. Create it
// after the test's server, so that it is closed before the server waits for
// its requests to end.
func newReleased(t *testing.T) *released {
	r := &released{ch: make(chan struct{})}
	t.Cleanup(r.free)
	return r
}

func (r *released) free() { r.once.Do(func() { close(r.ch) }) }

// waitClosed waits up to waitBound for ch to be closed.
func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitBound):
		t.Fatalf("timed out waiting for %s", what)
	}
}
