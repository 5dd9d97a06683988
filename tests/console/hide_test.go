package console

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/txhook/txhook/admin"
)

// TestHiddenPayloads needs no browser: the page's HTML must not carry the
// payload at all.
func TestHiddenPayloads(t *testing.T) {
	c := setup(t, admin.Config{HidePayloads: true})
	resp, err := http.Get(c.url + "/txhook/event?source=stripe&key=evt_dead_1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	page := string(body)
	if resp.StatusCode != http.StatusOK || strings.Contains(page, "4200") || strings.Contains(page, "&#34;customer&#34;") ||
		!strings.Contains(page, "76 bytes, hidden by the console&#39;s configuration") {
		t.Errorf("event page with HidePayloads: %d\n%s", resp.StatusCode, page)
	}
	if strings.Contains(page, `href="payload?`) {
		t.Errorf("event page with HidePayloads offers the payload's download:\n%s", page)
	}
	resp, err = http.Get(c.url + "/txhook/payload?source=stripe&key=evt_dead_1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if body, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusForbidden || strings.Contains(string(body), "4200") {
		t.Errorf("download with HidePayloads: %d, want 403\n%s", resp.StatusCode, body)
	}
}
