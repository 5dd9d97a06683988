// Package amqpconsumer applies the messages of a RabbitMQ queue exactly
// once to PostgreSQL through txhook's engine, on the official client
// (github.com/rabbitmq/amqp091-go).
//
// Each message becomes a txhook.Event of the consumer's source and goes
// through the Processor's routes (txhook.Config.Routes) with
// Processor.Deliver, in its route's mode (transactional, lease, inbox). The
// message is acknowledged only after Deliver answered a settled or stored
// outcome, so only after COMMIT:
//
//	rs := txhook.NewRoutes()
//	rs.Transactional("orders", "order.created", onOrderCreated)
//	proc, err := txhook.NewProcessor(pool, &txhook.Config{Routes: rs, StorePayload: true})
//	// ...
//	c, err := amqpconsumer.New(proc, &amqpconsumer.Config{
//		URL:    "amqp://guest:guest@127.0.0.1:5672/",
//		Queue:  "orders",
//		Source: "orders",
//	})
//	// ...
//	if err := c.Start(ctx); err != nil { ... }
//	defer c.Stop(context.WithoutCancel(ctx))
//
// # Key and type
//
// The key is the message's message-id property, set by the publisher: the
// same on every redelivery and on every publisher retry of the event. AMQP
// has no other stable id to fall back on (a delivery tag is per channel and
// changes on every redelivery), so a message without a message-id, or with
// one txhook refuses (longer than the Processor's key limit, a NUL byte,
// invalid UTF-8), is published to the dead-letter queue and then
// acknowledged: it is never applied. So is a message whose type txhook
// refuses.
//
// The event type is the message's type property. With
// Config.TypeFromRoutingKey it is the routing key the message was published
// with instead, and the type property is not read.
//
// # What each answer does to the message
//
//	processed, duplicate, failed (a dead letter, replayable),
//	ignored (no route), queued (inbox route)      ack
//	in flight elsewhere                           retry after txhook's Retry-After
//	handler error                                 retry after the backoff (RetryBase doubling to RetryMax)
//	database unavailable,
//	commit of unknown outcome                     retry after the backoff, spending no attempt (see below)
//	no usable key, invalid type                   to the dead-letter queue, then ack
//
// # Queues
//
// For a queue Q the consumer declares, when they are missing:
//
//   - Q: a durable quorum queue with a delivery limit (Config.DeliveryLimit)
//     that dead-letters, at least once, to Q.dead;
//   - Q.dead (Config.DeadLetterQueue): a durable quorum queue that holds
//     what can never be applied and what the broker gave up on;
//   - Q.retry.<wait> ("orders.retry.1s", "orders.retry.256s", and below a
//     second "orders.retry.512ms"): one durable quorum queue per wait,
//     declared the first time a message waits that long, whose messages
//     expire after the wait (x-message-ttl) and are dead-lettered, at least
//     once, back to Q.
//
// Declaring a queue that exists with the same arguments does nothing. A Q
// that exists with other arguments (a classic queue, another delivery
// limit) is used as it is, with a warning in the log; set DeliveryLimit to
// its limit, if it has one.
//
// # Retries that do not spin
//
// A message that must be delivered again is not requeued (RabbitMQ would
// deliver it again at once): a copy is published to the retry queue of its
// wait, with its properties and headers and an x-txhook-attempt header
// counting its attempts, and once the broker confirmed the copy (publisher
// confirms) the message is acknowledged. The copy comes back to Q after the
// wait. A consumer that dies between the two leaves both: the redelivery of
// the one already applied is a duplicate; a copy the broker does not
// confirm, or returns because its queue is gone (copies are published
// mandatory; the queue is declared again before the next one), leaves the
// message to the broker, given back to Q after the attempt's backoff (a
// nack, counted as a delivery by the quorum queue). A wait is rounded down to a
// power of two (of milliseconds below a second, of seconds above), so that
// the messages of one retry queue expire in the order they arrived (a
// queue expires messages at its head only): a wait of 5 minutes waits 256
// seconds, and RetryMax's default gives nine retry queues at most.
//
// The cost: a retry is a publish, its confirmation and an ack instead of
// one nack, and each wait a quorum queue of its own on the broker. In
// return the wait is held by the broker, not by the consumer (no prefetch
// slot is held while a message waits), it survives a restart of either, and
// no delivery of Q's quorum queue is spent on it: the quorum queue's
// delivery count counts only the deliveries that ended unanswered.
//
// # The broker's give-up is not a loss
//
// Two counts end a message's retries, and in both cases its last delivery
// is applied with txhook.DeliverOptions.LastAttempt, so that a handler's
// error is recorded as failed (a dead letter in the events table, shown in
// the console, replayable from it and from the CLI) before the ack:
//
//   - the attempt count: the MaxAttempts-th delivery (x-txhook-attempt
//     reaching MaxAttempts - 1) is the last;
//   - the broker's: a delivery whose x-delivery-count reached DeliveryLimit
//     is the quorum queue's last (after it, the broker dead-letters the
//     message to Q.dead). Deliveries end unanswered when the consumer dies
//     or its connection drops mid-message; a message that kills the
//     consumer every time thus ends in Q.dead rather than in a loop.
//
// A database that cannot be used (or a commit of unknown outcome) records
// nothing, so such a delivery spends no attempt: the message goes to a retry
// queue with its x-txhook-attempt unchanged and an x-txhook-outages header
// counting these deliveries, whose backoff grows with them. An outage thus
// gives nothing up, even on a last attempt (every later delivery is a last
// attempt until the database answers), and leaves a message the retries
// it had for its handler's errors once the database is back; each copy
// also starts with a fresh delivery count.
//
// # Concurrency, connections and shutdown
//
// The channel's prefetch (Config.Prefetch, basic.qos) bounds the messages
// delivered and not yet acknowledged, and each is applied in a goroutine of
// its own, so at most Prefetch at once, in no particular order. A long
// handler needs no heartbeat: RabbitMQ has no acknowledgement deadline for
// a consumer whose connection is alive.
//
// The client does not reconnect by itself, and the consumer does not use
// its optional recovery: after a recovery a delivery tag of the old channel
// could acknowledge another message on the new one. When the connection or
// the channel closes, the consumer waits for the messages it is applying
// (their acknowledgements can no longer reach the broker), dials again with
// backoff (100ms doubling to 5s), declares the queues and consumes again.
// The broker delivers the unacknowledged messages again; those whose
// effects committed are answered duplicate.
//
// Stop cancels the consumer at the broker, waits for the messages being
// applied to be acknowledged or sent to retry, and closes the connection;
// the messages delivered and not yet started go back to the queue.
//
// # Observability
//
// Each message is logged as the HTTP endpoint logs a delivery ("txhook:
// delivery", source, key, type, outcome, with transport=amqp and the action
// taken) and reported to Config.Observer with Status 0, so otelhook counts
// it under its source.
package amqpconsumer
