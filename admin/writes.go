package admin

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/db"
)

// maxBatch bounds the events one write may name.
const maxBatch = 500

type resultRow struct {
	Source, Key string
	OK          bool
	Message     string
}

type resultData struct {
	Action string
	Rows   []resultRow
	Done   int
}

// writeTargets checks that r may write and returns the events it names: the
// one in "one" (a row's own button) or the selected "ev" boxes.
func (h *Handler) writeTargets(w http.ResponseWriter, r *http.Request, action string) ([][2]string, bool) {
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	if err := r.ParseForm(); err != nil {
		h.fail(w, r, http.StatusBadRequest, fmt.Errorf("read form: %w", err))
		return nil, false
	}
	if !h.checkCSRF(r) {
		h.cfg.Logger.Warn("txhook console: write refused: missing or invalid CSRF token", "action", action, "user", h.user(r), "remote", r.RemoteAddr)
		h.fail(w, r, http.StatusForbidden, errors.New("missing or invalid CSRF token: reload the page and try again"))
		return nil, false
	}
	if !h.cfg.AllowWrites {
		h.cfg.Logger.Warn("txhook console: write refused: read-only console", "action", action, "user", h.user(r))
		h.fail(w, r, http.StatusForbidden, errors.New("this console is read-only (admin.Config.AllowWrites is off)"))
		return nil, false
	}
	ids := r.PostForm["ev"]
	if one := r.PostFormValue("one"); one != "" {
		ids = []string{one}
	}
	if len(ids) == 0 {
		h.fail(w, r, http.StatusBadRequest, errors.New("no event selected"))
		return nil, false
	}
	if len(ids) > maxBatch {
		h.fail(w, r, http.StatusBadRequest, fmt.Errorf("%d events selected, at most %d at a time", len(ids), maxBatch))
		return nil, false
	}
	out := make([][2]string, 0, len(ids))
	for _, id := range ids {
		s, k, err := parseEventID(id)
		if err != nil {
			h.fail(w, r, http.StatusBadRequest, err)
			return nil, false
		}
		out = append(out, [2]string{s, k})
	}
	return out, true
}

// replay replays the selected dead letters through Config.Processor, each in
// its own transaction.
func (h *Handler) replay(w http.ResponseWriter, r *http.Request) {
	targets, ok := h.writeTargets(w, r, "replay")
	if !ok {
		return
	}
	if h.cfg.Processor == nil {
		h.fail(w, r, http.StatusForbidden, errors.New("replay is not configured (admin.Config.Processor is nil)"))
		return
	}
	user := h.user(r)
	d := resultData{Action: "Replay"}
	for _, t := range targets {
		res, err := h.cfg.Processor.Replay(r.Context(), t[0], t[1])
		row := resultRow{Source: t[0], Key: t[1]}
		switch {
		case err != nil:
			row.Message = "not replayed: " + h.replayError(err)
		case res.Outcome == txhook.OutcomeProcessed:
			row.OK, row.Message = true, "replayed: processed, the event is done"
			d.Done++
		case res.Outcome == txhook.OutcomeDuplicate:
			row.OK, row.Message = true, "already done: nothing ran"
		case res.Outcome == txhook.OutcomeFailed:
			row.Message = "failed again (still a dead letter): " + h.shownError(fmt.Sprint(res.Err))
		case res.Outcome == txhook.OutcomeInFlight:
			row.Message = "not replayed: another replay or delivery holds the event; try again"
		default:
			row.Message = res.Outcome.String()
		}
		h.cfg.Logger.Info("txhook console: replay", "user", user, "source", t[0], "key", t[1], "result", row.Message)
		d.Rows = append(d.Rows, row)
	}
	h.render(w, r, http.StatusOK, "result", "dead-letters", "Replay", d)
}

// discard deletes the selected dead letters.
func (h *Handler) discard(w http.ResponseWriter, r *http.Request) {
	targets, ok := h.writeTargets(w, r, "discard")
	if !ok {
		return
	}
	ctx, cancel := h.ctx(r)
	defer cancel()
	user := h.user(r)
	q := db.New(h.db)
	d := resultData{Action: "Discard"}
	for _, t := range targets {
		row := resultRow{Source: t[0], Key: t[1]}
		n, err := q.AdminDiscardFailed(ctx, db.AdminDiscardFailedParams{Source: t[0], EventKey: t[1]})
		switch {
		case err != nil:
			row.Message = "unchanged: " + err.Error()
		case n == 0:
			row.Message = "unchanged: not a dead letter any more (replayed, discarded or being replayed)"
		default:
			row.OK, row.Message = true, "discarded: deleted from the events table"
			d.Done++
		}
		h.cfg.Logger.Info("txhook console: discard", "user", user, "source", t[0], "key", t[1], "result", row.Message)
		d.Rows = append(d.Rows, row)
	}
	h.render(w, r, http.StatusOK, "result", "dead-letters", "Discard", d)
}

// replayError is what the console shows and logs of an error of Replay:
// with Config.HidePayloads only txhook's own reasons (no payload, no
// handler, not failed, not found) are shown; any other error may come from
// the handler, and is hidden as shownError hides it.
func (h *Handler) replayError(err error) string {
	for _, known := range []error{txhook.ErrNoPayload, txhook.ErrNoHandler, txhook.ErrNotFailed, txhook.ErrEventNotFound} {
		if errors.Is(err, known) {
			return err.Error()
		}
	}
	return h.shownError(err.Error())
}
