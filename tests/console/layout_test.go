package console

import (
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/txhook/txhook/admin"
)

// TestLayout checks what an operator reads on the lists, in the window size
// of the screenshots (1280 px): a key stays on one line (a UUID key was
// broken mid-word across three lines while other columns had room), and the
// filters' placeholders are not cut.
func TestLayout(t *testing.T) {
	c := setup(t, admin.Config{AllowWrites: true})
	ctx := newTab(t)
	if _, err := c.pool.Exec(t.Context(), `
		INSERT INTO txhook_processed_events (source, event_key, event_type, status, completed_at, last_error, payload)
		VALUES ('stripe', 'evt_test_7', 'checkout.session.completed', 'failed', now(), 'permanent: ' || repeat('the order service refused the session ', 4), '{}')`); err != nil {
		t.Fatal(err)
	}
	for _, page := range []string{"/txhook/dead-letters", "/txhook/events?status=failed", "/txhook/events"} {
		run(t, ctx, chromedp.Navigate(c.url+page), chromedp.WaitVisible(chromedp.CSS("#events")))
		wrapped, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("td.key a"))
			.filter(a => a.getClientRects().length > 1).map(a => a.innerText)`))
		if err != nil {
			t.Fatal(err)
		}
		if len(wrapped) > 0 {
			t.Errorf("%s: keys broken across lines: %q", page, wrapped)
		}
		// The placeholder's width in the input's font, against the room
		// inside the input.
		cut, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll(".filters input[placeholder]"))
			.filter(i => {
				const s = getComputedStyle(i);
				const g = document.createElement("canvas").getContext("2d");
				g.font = s.fontStyle + " " + s.fontWeight + " " + s.fontSize + " " + s.fontFamily;
				return g.measureText(i.placeholder).width > i.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
			}).map(i => i.name + ": " + i.placeholder)`))
		if err != nil {
			t.Fatal(err)
		}
		if len(cut) > 0 {
			t.Errorf("%s: placeholders cut: %q", page, cut)
		}
	}
}
