package main

import (
	"context"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/rabbittest"
)

// TestAMQPChaosShort is a short run of the RabbitMQ scenario on the test
// broker, in a virtual host of its own: 300 events published with ids (some
// twice), the example killed four times, the run's broker connections
// closed from the server's side once (the full run, make chaos, restarts a
// node of its own), and PostgreSQL (a durable cluster of the test's own)
// restarted;
// every event must be applied exactly once, no message left in a queue.
func TestAMQPChaosShort(t *testing.T) {
	c := durableCluster(t)
	node := rabbittest.Node(t)
	_, vhost := rabbittest.VHost(t)
	cfg := defaultAMQPConfig()
	cfg.DatabaseURL, cfg.RestartDB = c.URL, c.Restart
	cfg.Node, cfg.VHost = node, vhost
	cfg.RestartBroker = func(ctx context.Context) error { return node.CloseConnections(ctx, vhost) }
	cfg.Messages = 300
	cfg.Kills = 4
	cfg.Customers = 10
	cfg.Timeout = 3 * time.Minute
	cfg.Seed = uint64(time.Now().UnixNano())
	cfg.Log = t.Logf
	res, err := runAMQP(t.Context(), cfg)
	mustBeClean(t, cfg.Seed, res, res.Problems, err)
	if res.Kills < cfg.Kills || res.BrokerRestarts != 1 || res.DBRestarts != 1 || res.Publishes <= int64(res.Messages) {
		t.Errorf("kills=%d broker_restarts=%d db_restarts=%d publishes=%d for %d messages: the run did not do what it claims",
			res.Kills, res.BrokerRestarts, res.DBRestarts, res.Publishes, res.Messages)
	}
}
