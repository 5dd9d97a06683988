// Package rabbittest finds a RabbitMQ broker for txhook's tests: the
// machine's server at 127.0.0.1:5672 (guest/guest) when it answers, else a
// node this test process starts for itself (package rabbitnode), else the
// test is skipped, and failed when the CI environment variable is set, so
// that a green CI run never hides skipped broker tests.
//
// Each test works in a virtual host of its own (VHost), deleted with its
// queues when the test ends, so that tests share no queue and leave none.
package rabbittest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/rabbitnode"
	"github.com/txhook/txhook/internal/testdb"
)

var (
	brokerOnce sync.Once
	broker     struct {
		node  *rabbitnode.Node
		owned bool
		err   error
	}
)

// Main runs the tests (with testdb's PostgreSQL, see testdb.Run), then
// stops the node this process started, if any. Call it from TestMain.
func Main(m *testing.M) {
	code := testdb.Run(m)
	if broker.owned {
		broker.node.Stop()
	}
	os.Exit(code)
}

// Node returns the broker the tests use, starting a node of the process's
// own when the machine's server does not answer. It skips t (fails it
// under CI) when none can be had.
func Node(t testing.TB) *rabbitnode.Node {
	t.Helper()
	brokerOnce.Do(func() {
		if reachable(rabbitnode.Shared.Addr) {
			broker.node = rabbitnode.Shared
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		broker.node, broker.err = rabbitnode.Start(ctx)
		broker.owned = broker.err == nil
	})
	if broker.err != nil {
		NoBroker(t, broker.err)
	}
	return broker.node
}

// NoBroker ends t when no broker can be had: skipped locally, failed when
// the CI environment variable is set.
func NoBroker(t testing.TB, err error) {
	t.Helper()
	msg := fmt.Sprintf("rabbittest: no RabbitMQ (start it with rabbitmq-server -detached, or install it: apt-get install rabbitmq-server): %v", err)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// VHost creates a virtual host of t's own on the test broker and returns
// its AMQP URL and name; the virtual host is deleted, with its queues, when
// t ends.
func VHost(t testing.TB) (url, vhost string) {
	t.Helper()
	n := Node(t)
	vhost = Name(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url, err := n.AddVhost(ctx, vhost)
	if err != nil {
		NoBroker(t, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := n.DeleteVhost(ctx, vhost); err != nil {
			t.Logf("rabbittest: delete vhost %s: %v", vhost, err)
		}
	})
	return url, vhost
}

// Name returns a name made of t's name and a random suffix, for the queues
// and virtual hosts of one test.
func Name(t testing.TB) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	r := strings.NewReplacer("/", ".", " ", "_", "#", "", "*", "")
	return "txhook-" + r.Replace(t.Name()) + "-" + hex.EncodeToString(b)
}

func reachable(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// DeleteQueues deletes, when t ends, the queues of the test broker's
// default virtual host whose names begin with prefix (a Name of t's), each
// with del (an AMQP client's queue.delete: this package has no client).
func DeleteQueues(t testing.TB, prefix string, del func(queue string) error) {
	t.Helper()
	n := Node(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		qs, err := n.Queues(ctx, "/", prefix)
		if err != nil {
			t.Logf("rabbittest: delete queues: %v", err)
			return
		}
		for q := range qs {
			if err := del(q); err != nil {
				t.Logf("rabbittest: delete queue %s: %v", q, err)
			}
		}
	})
}
