package natsconsumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/consume"
)

// Config configures a Consumer. Stream, Consumer and Source are required.
type Config struct {
	// Stream and Consumer name the JetStream stream and its durable pull
	// consumer whose messages the Consumer applies. The application creates
	// them with the settings it wants (AckWait, MaxDeliver, BackOff,
	// MaxAckPending; AckPolicy must be explicit); Start reads them.
	// Required.
	Stream, Consumer string
	// Source names the events' source in the events table (Event.Source):
	// keys are unique per source, so a message and an HTTP delivery of the
	// same source and key are one event. The Processor must have a route for
	// it (Config.Routes). Required.
	Source string
	// MaxInFlight is the most messages applied at once, each by a goroutine
	// of its own; it bounds the database connections the Consumer uses.
	// nats.go fetches up to as many more ahead, so the Consumer holds at
	// most twice MaxInFlight unacknowledged (the server's consumer setting
	// MaxAckPending must allow it). A message fetched ahead waits for a
	// free slot before its InProgress signals start: keep AckWait well
	// above the time MaxInFlight messages take. Defaults to 8.
	MaxInFlight int
	// TypeHeader is the message header that holds the event's type. When a
	// message has it, it wins over the subject (TypeSubjectPrefix).
	// Defaults to "Txhook-Type".
	TypeHeader string
	// TypeSubjectPrefix, when set, makes the rest of a message's subject
	// after it the event's type, for messages without TypeHeader: with
	// "orders.", a message on orders.invoice.paid is an invoice.paid event.
	// A subject without the prefix gives the type "" (the source's
	// fallback route). Defaults to "": the type comes from TypeHeader only.
	TypeSubjectPrefix string
	// KeyFromSequence makes "STREAM:SEQUENCE" (the stream's name and the
	// message's stream sequence) the key of a message without a Nats-Msg-Id
	// header. The sequence is stable for a message in its stream, so a
	// redelivery keeps its key; but a message published again is a new
	// message with a new sequence, so a publisher's retry is applied again,
	// and a stream deleted and created again numbers its messages from 1
	// once more, so its new messages would be taken for duplicates of the
	// old ones. Use it only for publishers that never retry, on a stream
	// that is never recreated. Defaults to false: a message without
	// Nats-Msg-Id is refused to DeadLetterSubject.
	KeyFromSequence bool
	// DeadLetterSubject is where a message that can never be applied goes
	// (no key, an invalid key or type): it is published there through
	// JetStream with its body and headers, and headers saying why and where
	// it came from, then terminated (Term) on its own stream. Start checks
	// that a stream other than the consumer's stores the subject. Defaults
	// to "txhook.dead-letter." followed by Source.
	DeadLetterSubject string
	// RetryDelay is the wait before a failed message is delivered again
	// (NakWithDelay), doubling with each delivery up to MaxRetryDelay, with
	// jitter. A message another delivery holds waits the Retry-After the
	// processor answers instead. Defaults to 1s.
	RetryDelay time.Duration
	// MaxRetryDelay bounds RetryDelay's doubling. Defaults to 5 minutes.
	MaxRetryDelay time.Duration
	// Logger receives a "txhook: delivery" line per message, with the HTTP
	// endpoint's attributes. Defaults to slog.Default().
	Logger *slog.Logger
	// Observer, if set, receives a report of every message, as from the
	// HTTP endpoint (Status is 0): the otelhook module's metrics. Defaults
	// to nil.
	Observer handler.Observer
}

// Defaults of Config.
const (
	defaultMaxInFlight      = 8
	defaultTypeHeader       = "Txhook-Type"
	defaultDeadLetterPrefix = "txhook.dead-letter."
	defaultAckWait          = 30 * time.Second // the server's, when a consumer's info has none
)

// Headers a dead-lettered message carries besides its own.
const (
	reasonHeader   = "Txhook-Dead-Letter-Reason"   // why it was refused
	subjectHeader  = "Txhook-Dead-Letter-Subject"  // its subject
	sequenceHeader = "Txhook-Dead-Letter-Sequence" // STREAM:SEQUENCE it had
)

// Consumer applies the messages of a JetStream pull consumer exactly once
// through a Processor's routes. Create it with New, run it with Start and
// stop it with Stop.
type Consumer struct {
	proc    *txhook.Processor
	js      jetstream.JetStream
	cons    jetstream.Consumer // looked up by Start
	cfg     Config
	backoff consume.Backoff

	// Read from the consumer's info by Start.
	maxDeliver int // 0: unlimited
	ackWait    time.Duration
	ackBackoff []time.Duration

	mu       sync.Mutex
	started  bool
	stopping chan struct{} // closed by Stop: fetch no more, hold only last deliveries
	stopOnce sync.Once
	cancel   context.CancelFunc // cancels the deliveries
	done     chan struct{}      // closed when every message is settled
	err      error              // why fetching ended early, valid after done
}

// New returns a Consumer that applies the messages of cfg's stream and
// consumer, through js, with proc's routes for cfg.Source. It fails when
// proc has no route for the source: such a consumer would acknowledge every
// message and apply none.
func New(proc *txhook.Processor, js jetstream.JetStream, cfg *Config) (*Consumer, error) {
	if proc == nil || js == nil {
		return nil, errors.New("natsconsumer: new consumer: nil processor or JetStream")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Stream == "" || c.Consumer == "" {
		return nil, errors.New("natsconsumer: new consumer: Config.Stream and Config.Consumer are required")
	}
	if err := (txhook.Event{Source: c.Source, Key: "k"}).Validate(); err != nil {
		return nil, fmt.Errorf("natsconsumer: new consumer: %w", err)
	}
	if !proc.HasRoutes(c.Source) {
		return nil, fmt.Errorf("natsconsumer: new consumer: the processor has no route for source %q (Config.Routes)", c.Source)
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = defaultMaxInFlight
	}
	if c.TypeHeader == "" {
		c.TypeHeader = defaultTypeHeader
	}
	if c.DeadLetterSubject == "" {
		c.DeadLetterSubject = defaultDeadLetterPrefix + c.Source
	}
	if !validSubject(c.DeadLetterSubject) {
		return nil, fmt.Errorf("natsconsumer: new consumer: dead-letter subject %q is not a subject to publish to (set Config.DeadLetterSubject)", c.DeadLetterSubject)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return &Consumer{
		proc: proc, js: js, cfg: c,
		backoff:  consume.Backoff{Base: c.RetryDelay, Max: c.MaxRetryDelay},
		stopping: make(chan struct{}),
		done:     make(chan struct{}),
	}, nil
}

// validSubject reports whether s can be published to: dot-separated
// non-empty tokens, no wildcards, no white space.
func validSubject(s string) bool {
	if s == "" || strings.ContainsAny(s, " \t\r\n") {
		return false
	}
	for tok := range strings.SplitSeq(s, ".") {
		if tok == "" || tok == "*" || tok == ">" {
			return false
		}
	}
	return true
}

// Start reads the consumer's settings from the server (AckWait, BackOff,
// MaxDeliver: restart the Consumer after changing them), checks them and
// the dead-letter subject's stream, and starts fetching messages in the
// background. ctx bounds that check; when it ends later, the Consumer stops
// as Stop makes it: it fetches no more and settles the messages it holds.
// Call Stop to wait for that.
func (c *Consumer) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return errors.New("natsconsumer: start: already started")
	}
	cons, err := c.js.Consumer(ctx, c.cfg.Stream, c.cfg.Consumer)
	if err != nil {
		return fmt.Errorf("natsconsumer: start: find consumer %s of stream %s: %w", c.cfg.Consumer, c.cfg.Stream, err)
	}
	info := cons.CachedInfo()
	if info.Config.AckPolicy != jetstream.AckExplicitPolicy {
		return fmt.Errorf("natsconsumer: start: consumer %s has ack policy %s, want explicit: each message is acknowledged after its COMMIT", info.Name, info.Config.AckPolicy)
	}
	dlStream, err := c.js.StreamNameBySubject(ctx, c.cfg.DeadLetterSubject)
	if err != nil {
		return fmt.Errorf("natsconsumer: start: find the stream of dead-letter subject %s (create one that stores it): %w", c.cfg.DeadLetterSubject, err)
	}
	if dlStream == info.Stream {
		return fmt.Errorf("natsconsumer: start: dead-letter subject %s is stored in the consumed stream %s: refused messages would come back", c.cfg.DeadLetterSubject, info.Stream)
	}
	c.cons = cons
	c.maxDeliver = max(info.Config.MaxDeliver, 0)
	c.ackWait = info.Config.AckWait
	c.ackBackoff = info.Config.BackOff
	// Deliveries are cancelled only when Stop's context ends first.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.cancel = cancel
	c.started = true
	context.AfterFunc(ctx, c.beginStop)
	go c.run(runCtx)
	return nil
}

// beginStop makes the Consumer fetch no more messages and hold none.
func (c *Consumer) beginStop() { c.stopOnce.Do(func() { close(c.stopping) }) }

// flushTimeout bounds the flush of the last acknowledgements when the
// Consumer stops.
const flushTimeout = 5 * time.Second

// Stop stops fetching, waits until every message the Consumer holds is
// settled (acknowledged, or handed back for redelivery) and the settlements
// are sent to the server, and returns. A
// message held while the database cannot be used is handed back at once
// (NakWithDelay), unless it is on its last delivery: then it is applied
// until ctx ends, and dead-lettered if it could not be. When ctx ends first,
// Stop cancels the deliveries still running (their messages are
// redelivered) and returns ctx's error at once, without waiting for them.
// Else Stop returns the error that ended fetching early, if one did (the
// connection closed).
func (c *Consumer) Stop(ctx context.Context) error {
	c.mu.Lock()
	started := c.started
	c.mu.Unlock()
	if !started {
		return errors.New("natsconsumer: stop: not started")
	}
	c.beginStop()
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
	}
	c.cancel()
	return fmt.Errorf("natsconsumer: stop: %w", ctx.Err())
}

// run pulls messages while there is room for them and hands each to a
// goroutine of its own, until Stop or ctx; then it waits for them.
func (c *Consumer) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		// The settled messages' acks and naks are sent without waiting
		// for the server: flush them, so that a process that exits once
		// Stop returns has handed them over. One lost is harmless (the
		// redelivery is a duplicate), so a failure is only logged.
		if err := c.js.Conn().FlushTimeout(flushTimeout); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			c.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "txhook: consumer stopped: its acknowledgements may not have reached the server",
				slog.String("source", c.cfg.Source), slog.String("error", err.Error()))
		}
		c.cancel()
		close(c.done)
	}()
	free := make(chan struct{}, c.cfg.MaxInFlight) // a token per free slot
	for range c.cfg.MaxInFlight {
		free <- struct{}{}
	}
	failures := 0
	for {
		delivered, err := c.pull(ctx, free, &wg)
		if delivered {
			failures = 0 // the subscription worked: a later failure starts the backoff again
		}
		switch {
		case c.stopped(ctx):
			return
		case errors.Is(err, nats.ErrConnectionClosed):
			c.err = fmt.Errorf("natsconsumer: pull messages: %w", err)
			c.cfg.Logger.LogAttrs(ctx, slog.LevelError, "txhook: consumer stopped: its NATS connection is closed",
				slog.String("source", c.cfg.Source), slog.String("error", err.Error()))
			return
		}
		failures++
		c.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "txhook: pull messages",
			slog.String("source", c.cfg.Source), slog.String("error", err.Error()))
		select { // a server that answers errors is not asked in a loop
		case <-time.After(c.backoff.Delay(failures)):
		case <-c.stopping:
		case <-ctx.Done():
		}
	}
}

// stopped reports whether Stop was called or ctx ended.
func (c *Consumer) stopped(ctx context.Context) bool {
	select {
	case <-c.stopping:
		return true
	default:
		return ctx.Err() != nil
	}
}

// pull reads messages from one pull subscription (Messages) and hands
// each to a goroutine of its own once a slot is free: at most MaxInFlight
// are applied at once, and nats.go asks the server for at most as many
// more ahead. After Stop the subscription drains: the messages fetched ahead
// are applied too, none is asked for. nats.go makes the pull request again
// after a reconnect. pull returns when the subscription is drained or ctx
// ends (nil), or when it fails, and whether it delivered any message.
func (c *Consumer) pull(ctx context.Context, free chan struct{}, wg *sync.WaitGroup) (delivered bool, err error) {
	it, err := c.cons.Messages(jetstream.PullMaxMessages(c.cfg.MaxInFlight))
	if err != nil {
		return false, err
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-c.stopping:
			it.Drain()
			return
		case <-ctx.Done():
		case <-done:
		}
		it.Stop()
	}()
	for {
		select {
		case <-free:
		case <-ctx.Done():
			return delivered, nil
		}
		// A bounded wait: nats.go v1.55 can miss making the next pull
		// request when a message arrives while it is still sending the
		// previous one; the next call makes it.
		msg, err := it.Next(jetstream.NextMaxWait(time.Second))
		switch {
		case errors.Is(err, nats.ErrTimeout), errors.Is(err, jetstream.ErrNoHeartbeat):
			free <- struct{}{} // nothing came; a pull request lost with a reconnect is made again
			continue
		case err != nil:
			free <- struct{}{}
			if c.stopped(ctx) {
				return delivered, nil
			}
			return delivered, err
		}
		delivered = true
		wg.Go(func() {
			defer func() { free <- struct{}{} }()
			c.handle(ctx, msg)
		})
	}
}

// handle applies one message and settles it: acknowledged once its event
// is settled or stored, redelivered later otherwise, dead-lettered when it
// can never be applied.
func (c *Consumer) handle(ctx context.Context, msg jetstream.Msg) {
	start := time.Now()
	md, err := msg.Metadata()
	if err != nil { // not a JetStream message: nothing to settle
		c.cfg.Logger.LogAttrs(ctx, slog.LevelError, "txhook: message without JetStream metadata",
			slog.String("source", c.cfg.Source), slog.String("subject", msg.Subject()), slog.String("error", err.Error()))
		return
	}
	defer c.keepAlive(ctx, msg, md.NumDelivered)()
	ev := c.event(msg, md)
	last := c.maxDeliver > 0 && md.NumDelivered >= uint64(c.maxDeliver)
	attempt := int(min(md.NumDelivered, 1<<20))
	for {
		res, err := c.proc.Deliver(ctx, ev, &txhook.DeliverOptions{LastAttempt: last})
		d := consume.Decide(res, err, attempt, c.backoff)
		if d.Action == consume.Reject {
			if derr := c.deadLetter(ctx, msg, md, d.Err); derr != nil {
				d = consume.Decision{Action: consume.Retry, Delay: c.backoff.Delay(attempt), Answer: d.Answer, Err: errors.Join(d.Err, derr)}
			}
		}
		if d.Action == consume.Retry && c.hold(ctx, last, d) {
			attempt++
			continue
		}
		c.settle(ctx, msg, md, ev, last, &d)
		consume.Report(ctx, c.cfg.Logger, c.cfg.Observer, "nats", d.Action, handler.Report{
			Source: ev.Source, Key: ev.Key, Type: ev.Type, Answer: d.Answer, Duration: time.Since(start), Err: d.Err,
		})
		return
	}
}

// hold reports whether a message whose delivery must be retried stays with
// the consumer, to be delivered again by it after d.Delay, rather than be
// handed back to the server: when the database could not be used (an
// outage then spends none of the message's deliveries), and on the last
// delivery (the server would not deliver it again). It waits d.Delay. After
// Stop, only a last delivery is held, until the Consumer's context ends.
func (c *Consumer) hold(ctx context.Context, last bool, d consume.Decision) bool {
	if !last && d.Answer != handler.AnswerUnavailable {
		return false
	}
	stopping := c.stopping
	if last {
		stopping = nil
	}
	select {
	case <-stopping:
		return false
	default:
	}
	t := time.NewTimer(d.Delay)
	defer t.Stop()
	select {
	case <-t.C:
		return ctx.Err() == nil
	case <-stopping:
		return false
	case <-ctx.Done():
		return false
	}
}

// settle tells the server what became of msg, as d says, and updates d with
// what could not be done.
func (c *Consumer) settle(ctx context.Context, msg jetstream.Msg, md *jetstream.MsgMetadata, ev txhook.Event, last bool, d *consume.Decision) {
	var err error
	switch d.Action {
	case consume.Ack:
		err = msg.Ack() // lost, it makes a redelivery: a duplicate
	case consume.Reject:
		err = msg.Term() // published to the dead-letter subject first
	case consume.Retry:
		if !last {
			err = msg.NakWithDelay(d.Delay)
			break
		}
		// The last delivery, and the Consumer is stopping with the event
		// not recorded: the server will not deliver it again, so the
		// message goes to the dead-letter subject.
		reason := fmt.Errorf("not applied on the last delivery (%d of %d): %w", md.NumDelivered, c.maxDeliver, d.Err)
		if derr := c.deadLetter(context.WithoutCancel(ctx), msg, md, reason); derr != nil {
			c.cfg.Logger.LogAttrs(ctx, slog.LevelError, "txhook: message on its last delivery neither applied nor dead-lettered",
				slog.String("source", ev.Source), slog.String("key", ev.Key),
				slog.String("stream", md.Stream), slog.Uint64("sequence", md.Sequence.Stream), slog.String("error", derr.Error()))
			return
		}
		d.Action = consume.Reject
		err = msg.Term()
	}
	if err != nil {
		c.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "txhook: settle message",
			slog.String("source", ev.Source), slog.String("key", ev.Key), slog.String("action", d.Action.String()),
			slog.String("error", err.Error()))
	}
}

// event builds the message's event: its key from Nats-Msg-Id (or the
// stream sequence, with KeyFromSequence), its type from TypeHeader or the
// subject.
func (c *Consumer) event(msg jetstream.Msg, md *jetstream.MsgMetadata) txhook.Event {
	h := msg.Headers()
	key := h.Get(jetstream.MsgIDHeader)
	if key == "" && c.cfg.KeyFromSequence {
		key = sequenceKey(md)
	}
	typ := h.Get(c.cfg.TypeHeader)
	if typ == "" && c.cfg.TypeSubjectPrefix != "" {
		typ, _ = strings.CutPrefix(msg.Subject(), c.cfg.TypeSubjectPrefix)
		if typ == msg.Subject() {
			typ = ""
		}
	}
	return txhook.Event{Source: c.cfg.Source, Key: key, Type: typ, Payload: msg.Data()}
}

// sequenceKey is "STREAM:SEQUENCE" of a message.
func sequenceKey(md *jetstream.MsgMetadata) string {
	return md.Stream + ":" + strconv.FormatUint(md.Sequence.Stream, 10)
}

// deadLetter publishes msg to the dead-letter subject with its headers and
// why, and waits for the stream to store it. A message without
// Nats-Msg-Id gets its STREAM:SEQUENCE as one, so that the dead-letter
// stream keeps one copy when it is published again (a crash before Term).
func (c *Consumer) deadLetter(ctx context.Context, msg jetstream.Msg, md *jetstream.MsgMetadata, reason error) error {
	h := nats.Header{}
	for k, v := range msg.Headers() {
		h[k] = v
	}
	if h.Get(jetstream.MsgIDHeader) == "" {
		h.Set(jetstream.MsgIDHeader, sequenceKey(md))
	}
	h.Set(reasonHeader, reason.Error())
	h.Set(subjectHeader, msg.Subject())
	h.Set(sequenceHeader, sequenceKey(md))
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.js.PublishMsg(ctx, &nats.Msg{Subject: c.cfg.DeadLetterSubject, Header: h, Data: msg.Data()}); err != nil {
		return fmt.Errorf("publish to dead-letter subject %s: %w", c.cfg.DeadLetterSubject, err)
	}
	return nil
}

// keepAlive tells the server that msg is being worked on (InProgress) every
// third of its ack wait while it is held, so that a long handler keeps its
// message; the function it returns stops that.
func (c *Consumer) keepAlive(ctx context.Context, msg jetstream.Msg, delivered uint64) func() {
	wait := c.ackWait
	if n := len(c.ackBackoff); n > 0 { // the server waits BackOff's entry for the delivery
		wait = c.ackBackoff[min(max(delivered, 1), uint64(n))-1]
	}
	if wait <= 0 {
		wait = defaultAckWait
	}
	every := max(wait/3, 10*time.Millisecond)
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(every, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if err := msg.InProgress(); err != nil {
			c.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "txhook: tell the server a message is in progress",
				slog.String("source", c.cfg.Source), slog.String("error", err.Error()))
		}
		t.Reset(every)
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}
