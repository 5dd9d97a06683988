package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/txhook/txhook"
)

// eventsCommands are the subcommands of events, in the order of events
// --help.
func eventsCommands() []command {
	return []command{
		{"list", "list events, newest first", runEventsList},
		{"show", "show one event, its payload included", runEventsShow},
		{"redelivered", "list the redeliveries that the GitHub sweeper requested", runEventsRedelivered},
	}
}

func runEvents(ctx context.Context, c *cli, args []string) error {
	subs := eventsCommands()
	if len(args) > 0 {
		for _, sub := range subs {
			if sub.name == args[0] {
				return sub.run(ctx, c, args[1:])
			}
		}
	}
	fs := c.newFlags("events", "events SUBCOMMAND [flags]")
	fs.Usage = func() {
		// Each subcommand's own usage and flags, so that one --help shows
		// every filter.
		fmt.Fprintf(c.stdout, "Usage: %s events SUBCOMMAND [flags]\n\nSubcommands:\n", c.name)
		for _, sub := range subs {
			fmt.Fprintf(c.stdout, "  %-13s %s\n", sub.name, sub.summary)
		}
		for _, sub := range subs {
			fmt.Fprintln(c.stdout)
			sub.run(ctx, c, []string{"--help"}) // prints its usage; returns flag.ErrHelp
		}
	}
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	names := make([]string, len(subs))
	for i, sub := range subs {
		names[i] = sub.name
	}
	want := strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
	if len(pos) == 0 {
		return usagef("missing subcommand: %s", want)
	}
	return usagef("unknown subcommand %q: want %s", pos[0], want)
}

func runEventsList(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlags("events list", "events list [--source S] [--status S] [--type T] [--since AGE|TIME] [--limit N] [--json]")
	var f txhook.EventFilter
	fs.StringVar(&f.Source, "source", "", "only events of this source")
	status := fs.String("status", "", "only events in this status: queued, in_progress, done or failed; or stuck (queued or in progress with nothing left to apply them: replay them)")
	fs.StringVar(&f.Type, "type", "", "only events of this type")
	since := fs.String("since", "", "only events created since: an age (90m, 36h, 7d) or a time (2006-01-02, RFC 3339)")
	fs.IntVar(&f.Limit, "limit", 50, "show at most N events, newest first")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	switch f.Status = txhook.Status(*status); f.Status {
	case "", txhook.StatusQueued, txhook.StatusInProgress, txhook.StatusDone, txhook.StatusFailed:
	case "stuck":
		f.Status, f.Stuck = "", true
	default:
		return usagef("--status must be queued, in_progress, done, failed or stuck, got %q", *status)
	}
	if f.Limit < 1 {
		return usagef("--limit must be at least 1")
	}
	if *since != "" {
		if f.Since, err = parseSince(*since, time.Now()); err != nil {
			return usagef("--since: %v", err)
		}
	}
	conn, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closeConn(conn)
	evs, err := txhook.ListEvents(ctx, conn, f)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(c.stdout, evs)
	}
	if len(evs) == 0 {
		fmt.Fprintln(c.stdout, "no events")
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tKEY\tTYPE\tSTATUS\tATTEMPTS\tCREATED\tCOMPLETED\tLAST ERROR")
	for _, e := range evs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n",
			cell(e.Source, 40), cell(e.Key, 60), cell(e.Type, 40), e.Status, e.Attempts,
			formatTime(e.CreatedAt), formatTime(e.CompletedAt), cell(e.LastError, 60))
	}
	return tw.Flush()
}

func runEventsShow(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlags("events show", "events show [--json] SOURCE KEY")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usagef("want SOURCE and KEY, got %d arguments", len(pos))
	}
	conn, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closeConn(conn)
	e, err := txhook.GetEventRecord(ctx, conn, pos[0], pos[1])
	if errors.Is(err, txhook.ErrEventNotFound) {
		return fmt.Errorf("no event with source %q and key %q", pos[0], pos[1])
	}
	if err != nil {
		return err
	}
	if *asJSON {
		out := struct {
			txhook.EventRecord
			Payload       json.RawMessage `json:"payload,omitempty"`
			PayloadBase64 []byte          `json:"payload_base64,omitempty"`
		}{EventRecord: e}
		if json.Valid(e.Payload) {
			out.Payload = e.Payload
		} else {
			out.PayloadBase64 = e.Payload
		}
		return writeJSON(c.stdout, out)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	for _, kv := range [][2]string{
		{"source", cell(e.Source, 0)},
		{"key", cell(e.Key, 0)},
		{"type", cell(e.Type, 0)},
		{"status", string(e.Status)},
		{"attempts", strconv.Itoa(e.Attempts)},
		{"created at", formatTime(e.CreatedAt)},
		{"claimed at", formatTime(e.ClaimedAt)},
		{"lease expires at", formatTime(e.LeaseExpiresAt)},
		{"completed at", formatTime(e.CompletedAt)},
		{"last error", cell(e.LastError, 0)},
		{"payload", payloadSummary(e)},
	} {
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if e.HasPayload && printable(string(e.Payload)) {
		fmt.Fprintf(c.stdout, "\n%s\n", e.Payload)
	}
	return nil
}

func payloadSummary(e txhook.EventRecord) string {
	switch {
	case !e.HasPayload:
		return "not stored (replay needs Config.StorePayload)"
	case printable(string(e.Payload)):
		return fmt.Sprintf("%d bytes, below", e.PayloadSize)
	}
	return fmt.Sprintf("%d bytes, binary (see --json)", e.PayloadSize)
}

// printable reports whether s is valid UTF-8 text without control
// characters other than newlines and tabs.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r != '\n' && r != '\t' && r != '\r' && !unicode.IsPrint(r) && !unicode.IsSpace(r) {
			return false
		}
	}
	return true
}

// cell makes s safe for one table cell: values containing control or
// non-graphic characters (which could break the table or drive the
// terminal; keys come from senders) are quoted with escapes, and values
// longer than width runes (when width > 0) are shortened. Empty is "-".
func cell(s string, width int) string {
	if s == "" {
		return "-"
	}
	if strings.IndexFunc(s, func(r rune) bool { return !unicode.IsGraphic(r) || r == utf8.RuneError }) >= 0 || !utf8.ValidString(s) {
		s = strconv.QuoteToGraphic(s)
	}
	if width > 0 && utf8.RuneCountInString(s) > width {
		s = string([]rune(s)[:width-1]) + "…"
	}
	return s
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05Z")
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
