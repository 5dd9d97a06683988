package amqpconsumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/consume"
)

// Config configures a Consumer. URL, Queue and Source are required.
type Config struct {
	// URL is the broker's address, amqp://user:password@host:port/vhost.
	// Required.
	URL string
	// Queue is the queue to consume. It is declared when missing, as a
	// durable quorum queue with a delivery limit (DeliveryLimit) that
	// dead-letters to DeadLetterQueue; a queue that exists with the same
	// arguments is used, and one that exists with other arguments is used
	// as it is (see the package documentation). Required.
	Queue string
	// Source names the events in txhook's events table: keys are unique
	// per source, and the Processor's routes for Source apply them. An
	// event that arrives both by HTTP and from the queue under one source
	// is applied once. Required; the Processor must hold a route for it.
	Source string
	// TypeFromRoutingKey takes the event type from the message's routing
	// key (the one it was published with) instead of its type property.
	// Defaults to false: the type property, and the routing key is never
	// read.
	TypeFromRoutingKey bool
	// Prefetch bounds the messages delivered and not yet acknowledged (the
	// channel's basic.qos), and so the messages applied at once, each in
	// its own goroutine. Keep it within the database pool's size. Defaults
	// to 8.
	Prefetch int
	// DeliveryLimit is the quorum queue's delivery limit
	// (x-delivery-limit) declared on Queue: how many times the broker
	// delivers a message again whose delivery ended unanswered (the
	// consumer died, its connection dropped) before it dead-letters it to
	// DeadLetterQueue. The delivery the broker says is its last
	// (x-delivery-count reaching it) is applied as a last attempt. For a
	// queue declared by someone else, set it to that queue's limit.
	// Defaults to 20.
	DeliveryLimit int
	// MaxAttempts is how many times a message is applied before its
	// handler's error is recorded as failed (a dead letter in txhook's
	// events table, replayable from the console and the CLI): each answer
	// other than a settled one sends the message through the retry queues,
	// counted in its x-txhook-attempt header, and the MaxAttempts-th
	// delivery is the last attempt. A delivery that finds the database
	// unusable (or a commit of unknown outcome) spends no attempt: it is
	// retried with the backoff, counted apart (x-txhook-outages), so that
	// an outage neither gives a message up nor leaves it with no retries
	// for its handler's errors once the database is back. Defaults to 20
	// (about an hour of retries with the default backoff).
	MaxAttempts int
	// RetryBase and RetryMax bound the wait before a message is delivered
	// again after a handler error or a database that could not be used:
	// RetryBase after the first attempt, doubling up to RetryMax, with
	// jitter. A message in flight elsewhere waits the Retry-After that
	// txhook answered. Each wait is taken in a retry queue of its own,
	// rounded down to a power of two of milliseconds (below a second) or
	// of seconds. Default to 1s and 5m.
	RetryBase, RetryMax time.Duration
	// DeadLetterQueue receives the messages that can never be applied (no
	// message-id, or one txhook refuses: too long, NUL, invalid UTF-8; an
	// invalid type), and those the broker gives up on. Declared when
	// missing, as a durable quorum queue. Defaults to Queue + ".dead".
	DeadLetterQueue string
	// Logger receives one record per message ("txhook: delivery", as the
	// HTTP endpoint logs), and the connection's losses. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// Observer, if set, receives a Report per message, as from the HTTP
	// endpoint (Status 0): otelhook's Observer counts them by source.
	Observer handler.Observer
}

// Defaults.
const (
	defaultPrefetch      = 8
	defaultDeliveryLimit = 20
	defaultMaxAttempts   = 20
	// transport names the consumer in its log records.
	transport = "amqp"
)

// Consumer takes messages from a RabbitMQ queue and applies each exactly
// once through a Processor's routes, acknowledging it only after its
// effects are committed. Create it with New, run it with Start, end it with
// Stop.
type Consumer struct {
	proc    *txhook.Processor
	cfg     Config
	backoff consume.Backoff
	log     *slog.Logger
	tag     string // consumer tag

	mu      sync.Mutex
	started bool
	stop    chan struct{} // closed by Stop
	done    chan struct{} // closed when the run loop returned

	// work is the context of the messages' Deliver calls: it outlives
	// the connections, and Stop cancels it when its own context ends.
	work       context.Context
	cancelWork context.CancelFunc
}

// New returns a Consumer of cfg.Queue that applies its messages through
// proc's routes (txhook.Config.Routes) for cfg.Source. It refuses a source
// without a route: the consumer would acknowledge every message and apply
// none.
func New(proc *txhook.Processor, cfg *Config) (*Consumer, error) {
	if proc == nil {
		return nil, errors.New("amqpconsumer: nil processor")
	}
	if cfg == nil {
		return nil, errors.New("amqpconsumer: nil config: URL, Queue and Source are required")
	}
	c := *cfg
	var problems []error
	if c.URL == "" {
		problems = append(problems, errors.New("URL is required"))
	} else if _, err := amqp.ParseURI(c.URL); err != nil {
		problems = append(problems, fmt.Errorf("parse URL: %w", err))
	}
	if c.Queue == "" {
		problems = append(problems, errors.New("queue is required"))
	}
	if c.Source == "" {
		problems = append(problems, errors.New("source is required"))
	} else if !proc.HasRoutes(c.Source) {
		problems = append(problems, fmt.Errorf("the processor has no route for source %q (txhook.Config.Routes)", c.Source))
	}
	if c.Prefetch < 0 || c.DeliveryLimit < 0 || c.MaxAttempts < 0 || c.RetryBase < 0 || c.RetryMax < 0 {
		problems = append(problems, errors.New("prefetch, DeliveryLimit, MaxAttempts, RetryBase and RetryMax must not be negative"))
	}
	if c.Prefetch > 65535 {
		problems = append(problems, errors.New("prefetch must be at most 65535"))
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("amqpconsumer: invalid config: %w", errors.Join(problems...))
	}
	if c.Prefetch == 0 {
		c.Prefetch = defaultPrefetch
	}
	if c.DeliveryLimit == 0 {
		c.DeliveryLimit = defaultDeliveryLimit
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = defaultMaxAttempts
	}
	if c.DeadLetterQueue == "" {
		c.DeadLetterQueue = c.Queue + ".dead"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	b := consume.Backoff{Base: c.RetryBase, Max: c.RetryMax}
	if b.Base == 0 {
		b.Base = consume.DefaultBackoff.Base
	}
	if b.Max == 0 {
		b.Max = max(consume.DefaultBackoff.Max, b.Base)
	}
	tag := make([]byte, 6)
	_, _ = rand.Read(tag) // crypto/rand.Read never fails
	return &Consumer{
		proc: proc, cfg: c, backoff: b, log: c.Logger,
		tag:  "txhook-" + c.Source + "-" + hex.EncodeToString(tag),
		stop: make(chan struct{}), done: make(chan struct{}),
	}, nil
}

// Start connects to the broker, declares the queues when missing and
// starts consuming; it returns an error when that first connection fails
// (ctx bounds it). Then the consumer runs in the background until Stop: a
// connection that drops is dialled again with backoff (100ms doubling to
// 5s), the queues declared again and the consumer resumed. Start may be
// called once, and not after Stop.
func (c *Consumer) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started || c.stopping() {
		return errors.New("amqpconsumer: start: already started or stopped")
	}
	c.work, c.cancelWork = context.WithCancel(context.WithoutCancel(ctx))
	s, err := c.connect(ctx)
	if err != nil {
		c.cancelWork()
		return fmt.Errorf("amqpconsumer: start: %w", err)
	}
	c.started = true
	go c.run(s)
	return nil
}

// Stop stops taking messages (the broker is told to cancel the consumer),
// waits for the messages in flight to be acknowledged or sent to retry,
// and closes the connection. When ctx ends first, the messages still being
// applied are cancelled (their transactions roll back, the broker delivers
// them again) and ctx's error is returned. Messages delivered and not yet
// started are given back to the broker by the channel's close.
func (c *Consumer) Stop(ctx context.Context) error {
	c.mu.Lock()
	started := c.started
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	c.mu.Unlock()
	if !started {
		return nil
	}
	select {
	case <-c.done:
		c.cancelWork()
		return nil
	case <-ctx.Done():
		c.cancelWork()
		<-c.done
		return fmt.Errorf("amqpconsumer: stop: %w", ctx.Err())
	}
}

// stopping reports whether Stop was called.
func (c *Consumer) stopping() bool {
	select {
	case <-c.stop:
		return true
	default:
		return false
	}
}

// Reconnection backoff bounds.
const (
	redialBase = 100 * time.Millisecond
	redialMax  = 5 * time.Second
)

// run serves s and every session after it until Stop.
func (c *Consumer) run(s *session) {
	defer close(c.done)
	redial := consume.Backoff{Base: redialBase, Max: redialMax}
	failures := 0
	for {
		if s != nil {
			failures = 0
			err := c.serve(s)
			if c.stopping() {
				return
			}
			c.log.Warn("amqpconsumer: connection lost; reconnecting", "source", c.cfg.Source, "queue", c.cfg.Queue, "error", err)
		}
		failures++
		select {
		case <-time.After(redial.Delay(failures)):
		case <-c.stop:
			return
		}
		ctx, cancel := context.WithTimeout(c.work, 30*time.Second)
		var err error
		s, err = c.connect(ctx)
		cancel()
		if err != nil {
			c.log.Warn("amqpconsumer: reconnect failed", "source", c.cfg.Source, "queue", c.cfg.Queue, "attempt", failures, "error", err)
			s = nil
		}
	}
}

// serve takes s's deliveries, each applied in a goroutine of its own,
// until the connection or the channel closes or Stop is called; then it
// waits for the messages in flight and closes the connection.
func (c *Consumer) serve(s *session) error {
	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		s.close()
	}()
	for {
		select {
		case d, ok := <-s.deliveries:
			if !ok {
				return s.closeReason()
			}
			wg.Go(func() { c.handle(s, d) })
		case <-c.stop:
			if err := s.ch.Cancel(c.tag, false); err != nil {
				c.log.Warn("amqpconsumer: cancel consumer", "source", c.cfg.Source, "queue", c.cfg.Queue, "error", err)
			}
			return nil
		case err := <-s.closed:
			return err
		}
	}
}
