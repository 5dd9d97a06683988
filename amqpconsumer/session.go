package amqpconsumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// session is one connection to the broker and its consuming channel. A
// message is acknowledged on the channel it was delivered on: when the
// connection drops, its messages in flight can no longer be acknowledged,
// and the broker delivers them again on the next session (the
// acknowledgement of a message whose effects committed is then lost, and
// its redelivery is a duplicate).
type session struct {
	c          *Consumer
	conn       *amqp.Connection
	ch         *amqp.Channel // consumes; publishes the retry and dead-letter copies, confirmed
	deliveries <-chan amqp.Delivery
	closed     chan error // the first close of the connection or the channel

	mu       sync.Mutex // guards decl and declared
	decl     *amqp.Channel
	declared map[string]bool // retry and dead-letter queues declared on this connection

	// Copies are published mandatory: one that reaches no queue (a retry
	// or dead-letter queue deleted under the consumer) comes back on
	// returns before its confirmation, marked with its number.
	copies   atomic.Int64       // the last copy number given
	returns  <-chan amqp.Return // the broker's returns of unroutable copies
	retMu    sync.Mutex         // guards returned
	returned map[int64]bool     // copies returned, read from returns, not yet seen by their publisher
}

// connect dials the broker, declares the queues and starts consuming.
func (c *Consumer) connect(ctx context.Context) (*session, error) {
	timeout := 30 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	conn, err := amqp.DialConfig(c.cfg.URL, amqp.Config{
		Dial:       amqp.DefaultDial(timeout),
		Heartbeat:  10 * time.Second,
		Properties: amqp.Table{"connection_name": "txhook amqpconsumer " + c.cfg.Source + " " + c.cfg.Queue},
	})
	if err != nil {
		return nil, fmt.Errorf("dial broker: %w", err)
	}
	s := &session{c: c, conn: conn, closed: make(chan error, 2), declared: map[string]bool{}, returned: map[int64]bool{}}
	if err := s.open(); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return s, nil
}

func (s *session) open() error {
	c := s.c
	connClosed := s.conn.NotifyClose(make(chan *amqp.Error, 1))
	if err := s.declareMain(); err != nil {
		return err
	}
	ch, err := s.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	s.ch = ch
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("enable publisher confirms: %w", err)
	}
	// A return is handed over before its copy's confirmation, by the
	// goroutine reading the connection: the buffer holds one for each copy
	// in flight (at most one per message held), so that it never waits.
	s.returns = ch.NotifyReturn(make(chan amqp.Return, c.cfg.Prefetch+1))
	s.deliveries, err = ch.Consume(c.cfg.Queue, c.tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume queue %q: %w", c.cfg.Queue, err)
	}
	go func() {
		var e *amqp.Error
		select {
		case e = <-connClosed:
		case e = <-chClosed:
		}
		if e == nil {
			s.closed <- amqp.ErrClosed
			return
		}
		s.closed <- e
	}()
	return nil
}

// closeReason is why the deliveries ended.
func (s *session) closeReason() error {
	select {
	case err := <-s.closed:
		return err
	case <-time.After(time.Second):
		return errors.New("consumer cancelled by the broker")
	}
}

// close closes the session's connection; its unacknowledged messages go
// back to the queue.
func (s *session) close() {
	_ = s.conn.Close()
}

// Queue arguments (RabbitMQ's names).
const (
	argQueueType   = "x-queue-type"
	argDelivery    = "x-delivery-limit"
	argDLX         = "x-dead-letter-exchange"
	argDLRoutingKy = "x-dead-letter-routing-key"
	argDLStrategy  = "x-dead-letter-strategy"
	argOverflow    = "x-overflow"
	argMessageTTL  = "x-message-ttl"
)

// mainArgs are the arguments Queue is declared with: a quorum queue whose
// delivery limit dead-letters, at least once, to the dead-letter queue.
func (c *Consumer) mainArgs() amqp.Table {
	return amqp.Table{
		argQueueType:   "quorum",
		argDelivery:    int64(c.cfg.DeliveryLimit),
		argDLX:         "",
		argDLRoutingKy: c.cfg.DeadLetterQueue,
		argDLStrategy:  "at-least-once",
		argOverflow:    "reject-publish",
	}
}

// retryArgs are the arguments of the retry queue that holds messages for
// wait: each expires there after wait and is dead-lettered, at least once,
// back to Queue.
func (c *Consumer) retryArgs(wait time.Duration) amqp.Table {
	return amqp.Table{
		argQueueType:   "quorum",
		argMessageTTL:  wait.Milliseconds(),
		argDLX:         "",
		argDLRoutingKy: c.cfg.Queue,
		argDLStrategy:  "at-least-once",
		argOverflow:    "reject-publish",
	}
}

// codePreconditionFailed is AMQP's answer to a declaration whose arguments
// differ from the existing queue's.
const codePreconditionFailed = 406

// declareMain declares the dead-letter queue and Queue. A Queue that
// exists with other arguments is used as it is, with a warning.
func (s *session) declareMain() error {
	c := s.c
	if _, err := s.ensure(c.cfg.DeadLetterQueue, deadArgs); err != nil {
		return err
	}
	return s.declare(c.cfg.Queue, c.mainArgs(), true)
}

// deadArgs are the dead-letter queue's arguments.
var deadArgs = amqp.Table{argQueueType: "quorum"}

// declare declares the durable queue name with args on the session's
// declaring channel. When the queue exists with other arguments and
// asIs, the queue is checked to exist and used as it is.
func (s *session) declare(name string, args amqp.Table, asIs bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, err := s.declChannel()
	if err != nil {
		return err
	}
	_, err = ch.QueueDeclare(name, true, false, false, false, args)
	if err == nil {
		return nil
	}
	s.decl = nil // a refused declaration closes the channel
	var ae *amqp.Error
	if !asIs || !errors.As(err, &ae) || ae.Code != codePreconditionFailed {
		return fmt.Errorf("declare queue %q: %w", name, err)
	}
	ch, err2 := s.declChannel()
	if err2 != nil {
		return err2
	}
	if _, err2 := ch.QueueDeclarePassive(name, true, false, false, false, nil); err2 != nil {
		s.decl = nil
		return fmt.Errorf("declare queue %q: %w", name, errors.Join(err, err2))
	}
	s.c.log.Warn("amqpconsumer: the queue exists with other arguments; it is used as it is, without the delivery limit and dead-lettering the consumer declares",
		"source", s.c.cfg.Source, "queue", name, "error", err)
	return nil
}

// declChannel returns the channel declarations are made on, opening it
// when needed. s.mu is held.
func (s *session) declChannel() (*amqp.Channel, error) {
	if s.decl == nil || s.decl.IsClosed() {
		ch, err := s.conn.Channel()
		if err != nil {
			return nil, fmt.Errorf("open channel: %w", err)
		}
		s.decl = ch
	}
	return s.decl, nil
}

// retryQueue declares, once per connection, the retry queue for wait and
// returns its name.
func (s *session) retryQueue(wait time.Duration) (string, error) {
	return s.ensure(s.c.cfg.Queue+".retry."+waitName(wait), s.c.retryArgs(wait))
}

// ensure declares the queue name with args unless it was declared on this
// connection since a copy sent to it last came back, and returns name.
func (s *session) ensure(name string, args amqp.Table) (string, error) {
	s.mu.Lock()
	done := s.declared[name]
	s.mu.Unlock()
	if done {
		return name, nil
	}
	if err := s.declare(name, args, false); err != nil {
		return "", err
	}
	s.mu.Lock()
	s.declared[name] = true
	s.mu.Unlock()
	return name, nil
}

// retryWait rounds d down to the wait of a retry queue: a power of two of
// milliseconds below a second, of seconds from a second on, so that a
// handful of queues hold every wait and each queue's messages expire in
// the order they arrived.
func retryWait(d time.Duration) time.Duration {
	unit := time.Second
	if d < time.Second {
		unit = time.Millisecond
	}
	n := max(int64(d/unit), 1)
	p := int64(1)
	for p*2 <= n {
		p *= 2
	}
	return time.Duration(p) * unit
}

// waitName names a retry queue's wait: "250ms" is never made (waits are
// powers of two), so names read "1s", "256s", "512ms".
func waitName(wait time.Duration) string {
	if wait < time.Second {
		return strconv.FormatInt(wait.Milliseconds(), 10) + "ms"
	}
	return strconv.FormatInt(int64(wait/time.Second), 10) + "s"
}

// publish publishes p to queue through the default exchange on the
// consuming channel, mandatory, and waits for the broker's confirmation:
// only then, unless the broker returned it, is the copy the broker's to
// keep. A copy returned (its queue is gone) is an error, and the queue is
// declared again before the next copy sent to it.
func (s *session) publish(ctx context.Context, queue string, p amqp.Publishing) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	n := s.copies.Add(1)
	p.Headers[headerCopy] = n
	dc, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, p)
	if err != nil {
		return fmt.Errorf("publish to %q: %w", queue, err)
	}
	ok, err := dc.WaitContext(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("publish to %q: wait for the confirmation: %w", queue, err)
	case !ok:
		return fmt.Errorf("publish to %q: refused by the broker (or the channel closed)", queue)
	case s.wasReturned(n):
		s.mu.Lock()
		delete(s.declared, queue)
		s.mu.Unlock()
		return fmt.Errorf("publish to %q: returned by the broker: no such queue (deleted while the consumer ran?); it is declared again", queue)
	}
	return nil
}

// wasReturned reports whether the broker returned copy n, once its
// confirmation arrived (a return comes before its confirmation).
func (s *session) wasReturned(n int64) bool {
	s.retMu.Lock()
	defer s.retMu.Unlock()
	for drained := false; !drained; {
		select {
		case r := <-s.returns:
			if m, ok := r.Headers[headerCopy].(int64); ok {
				s.returned[m] = true
			}
		default:
			drained = true
		}
	}
	if !s.returned[n] {
		return false
	}
	delete(s.returned, n)
	return true
}
