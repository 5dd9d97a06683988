package console

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/txhook/txhook/admin"
)

// get returns the status and body of a GET of u.
func get(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestHiddenPayloads needs no browser: with HidePayloads the console's
// pages, its download and its log of writes carry neither a payload nor a
// handler's error, which may quote one (the seeded errors name the
// customers of the payloads, cus_123 and cus_456).
func TestHiddenPayloads(t *testing.T) {
	c := setup(t, admin.Config{HidePayloads: true, AllowWrites: true})
	code, page := get(t, c.url+"/txhook/event?source=stripe&key=evt_dead_1")
	if code != http.StatusOK || strings.Contains(page, "4200") || strings.Contains(page, "&#34;customer&#34;") ||
		!strings.Contains(page, "76 bytes, hidden by the console&#39;s configuration") {
		t.Errorf("event page with HidePayloads: %d\n%s", code, page)
	}
	if strings.Contains(page, "cus_123") || !strings.Contains(page, "hidden by the console&#39;s configuration (errors may quote payloads)") {
		t.Errorf("event page with HidePayloads shows the handler's error:\n%s", page)
	}
	if strings.Contains(page, `href="payload?`) {
		t.Errorf("event page with HidePayloads offers the payload's download:\n%s", page)
	}
	if code, body := get(t, c.url+"/txhook/payload?source=stripe&key=evt_dead_1"); code != http.StatusForbidden || strings.Contains(body, "cus_123") {
		t.Errorf("download with HidePayloads: %d, want 403\n%s", code, body)
	}
	for _, list := range []string{"/txhook/dead-letters", "/txhook/events?status=failed", "/txhook/events"} {
		if code, body := get(t, c.url+list); code != http.StatusOK || strings.Contains(body, "cus_") || strings.Contains(body, "negative amount") {
			t.Errorf("%s with HidePayloads: %d, shows the handlers' errors:\n%s", list, code, body)
		}
	}

	// A replay failing again: its new error is hidden on the result page and
	// in the log; txhook's own reasons (no stored payload) are shown.
	cl, token := formToken(t, c.url+"/txhook/dead-letters")
	code, body := post(t, cl, c.url+"/txhook/replay", url.Values{"csrf": {token}, "ev": {
		"c3RyaXBl.ZXZ0X2RlYWRfbmVn",                                 // stripe / evt_dead_neg: fails again, negative amount -5
		"Z2l0aHVi.YTFiMmMzZDQtMDAwMC00MDAwLTgwMDAtMDAwMDAwMDAwMDAx", // github / a1b2c3d4-…: no payload
	}})
	if code != http.StatusOK || strings.Contains(body, "negative amount") ||
		!strings.Contains(body, "failed again (still a dead letter): hidden by the console&#39;s configuration") ||
		!strings.Contains(body, "txhook: event has no stored payload") {
		t.Errorf("replay with HidePayloads: %d\n%s", code, body)
	}
	if logs := c.logs.String(); strings.Contains(logs, "negative amount") || !strings.Contains(logs, "key=evt_dead_neg") {
		t.Errorf("the log of writes with HidePayloads:\n%s", logs)
	}
}
