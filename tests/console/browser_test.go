package console

import (
	"context"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// One headless Chromium serves every test of the package; each test gets its
// own tab (and its own cookies: see newTab).
var chrome struct {
	once   sync.Once
	ctx    context.Context
	cancel func()
	err    error
	dir    string
}

// findChromium returns the path of a Chromium or Chrome binary.
func findChromium() (string, error) {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p, nil
	}
	var err error
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		var p string
		if p, err = exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", err
}

func startChromium() {
	path, err := findChromium()
	if err != nil {
		chrome.err = err
		return
	}
	chrome.dir, err = os.MkdirTemp("", "txhook-chromium-")
	if err != nil {
		chrome.err = err
		return
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(chrome.dir),
		chromedp.NoSandbox, // tests may run as root, where Chromium's sandbox refuses to start
		chromedp.Headless,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	// Start the browser now (the browser lives as long as the context of
	// this first call, so it has no timeout; the allocator bounds the
	// start), so that a broken install fails here rather than in a test.
	if err := chromedp.Do(bctx); err != nil {
		cancelBrowser()
		cancelAlloc()
		chrome.err = err
		return
	}
	chrome.ctx = bctx
	chrome.cancel = func() { cancelBrowser(); cancelAlloc(); os.RemoveAll(chrome.dir) }
}

// stopChromium ends the browser started by the tests, if any.
func stopChromium() {
	if chrome.cancel != nil {
		chrome.cancel()
	}
}

// newTab returns a browser context for t: a new tab in the package's
// Chromium, closed when t ends, with every action bounded by a minute. It
// skips t when no Chromium can be started, and fails it when the CI
// environment variable is set.
func newTab(t *testing.T) context.Context {
	t.Helper()
	chrome.once.Do(startChromium)
	if chrome.err != nil {
		msg := "no headless Chromium (apt-get install chromium, or set CHROMIUM): " + chrome.err.Error()
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	// A new browser context (an incognito-like profile) per test: its own
	// cookies, so the tests' CSRF cookies do not meet.
	tab, cancelTab := chromedp.NewContext(chrome.ctx, chromedp.WithNewBrowserContext())
	t.Cleanup(cancelTab)
	if err := chromedp.Do(tab); err != nil { // the tab lives as long as this first call's context
		t.Fatalf("open a tab: %v", err)
	}
	ctx, cancel := context.WithTimeout(tab, time.Minute)
	t.Cleanup(cancel)
	return ctx
}
