// Package natsconsumer applies the messages of a NATS JetStream stream
// exactly once to PostgreSQL with txhook, on github.com/nats-io/nats.go's
// jetstream package.
//
// A Consumer fetches messages from a durable pull consumer, builds each
// one's event (source: Config.Source; key: the publisher's Nats-Msg-Id
// header; type: a header or the subject; payload: the body), applies it
// through the Processor's routes (txhook.Processor.Deliver: transactional,
// lease and inbox routes alike) and acknowledges the message only after
// COMMIT. A consumer killed anywhere before the ack leaves the message
// unacknowledged: the server delivers it again after AckWait, and txhook
// answers it as a duplicate if its event was committed. The stream's
// duplicate window (Duplicates, 2 minutes by default) drops a publisher's
// retry within the window; the events table dedupes for as long as its rows
// are kept (14 days by default), so a retry after the window is harmless too.
//
// # Answers
//
//	processed, committed                        Ack
//	duplicate of a processed (or failed) event  Ack, nothing runs
//	handler returned txhook.Permanent           Ack, recorded as failed (a dead letter, replayable)
//	inbox route: event and job committed        Ack, applied later by the job
//	event type without a route                  Ack, nothing runs
//	in flight elsewhere                         NakWithDelay(the processor's Retry-After)
//	handler error                               NakWithDelay(RetryDelay, doubling to MaxRetryDelay)
//	database unavailable, commit unknown        kept: delivered again by the consumer itself, with
//	                                            backoff, spending none of MaxDeliver (see below)
//	no key, an invalid key or type              published to DeadLetterSubject, then Term; never applied
//	handler error on the last delivery          Ack, recorded as failed (a dead letter, replayable)
//
// # The last delivery
//
// A consumer with MaxDeliver set stops delivering a message after that
// many deliveries. The Consumer reads MaxDeliver at Start, and on a
// message's last delivery (Metadata().NumDelivered reaching it) applies it
// with DeliverOptions.LastAttempt: a handler error then records the event
// as failed, shown in the console and replayable from it and the CLI, before
// the ack. A database that cannot be used records nothing, so a message
// never leaves on a database fault: the Consumer keeps it (InProgress) and
// delivers it again itself, with backoff, until the database answers. It
// does the same for every delivery's database fault, so an outage spends
// none of a message's deliveries; after Stop such a message is handed back
// (NakWithDelay), unless it is on its last delivery: that one is applied
// until Stop's context ends and then published to the dead-letter subject
// with the reason, so that even then it is not lost silently.
//
// # Long handlers and concurrency
//
// While a message is applied, the Consumer tells the server every third of
// its ack wait (AckWait, or the consumer's BackOff entry for the delivery)
// that it is in progress, so a handler may run past AckWait. At most
// Config.MaxInFlight messages are applied at once, each by its own
// goroutine, from one pull subscription that fetches up to as many ahead.
// Stop fetches no more, applies the messages already fetched, waits for
// them, and returns.
//
// # Connections
//
// nats.go reconnects by itself, and its pull subscription asks for messages
// again after a reconnect; connect with nats.MaxReconnects(-1), so that the
// connection is never given up (a closed connection ends the Consumer: Stop
// returns why). An ack that cannot reach the server after COMMIT is
// harmless: the message is delivered again and answered as a duplicate.
//
// # Setup
//
//	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
//	js, err := jetstream.New(nc)
//	// the stream, its consumer (AckPolicy explicit), and a stream for dead letters
//	_, err = js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
//		Durable: "orders-app", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 10,
//	})
//	c, err := natsconsumer.New(proc, js, &natsconsumer.Config{
//		Stream: "ORDERS", Consumer: "orders-app", Source: "stripe",
//		TypeSubjectPrefix: "orders.", DeadLetterSubject: "orders-dead",
//	})
//	if err := c.Start(ctx); err != nil { ... }
//	defer c.Stop(context.Background())
//
// See docs/consumers.md for the broker settings that matter and the
// stripe-orders example for a runnable application.
package natsconsumer
