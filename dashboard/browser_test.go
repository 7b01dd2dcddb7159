package dashboard_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// The browser tests drive a real headless Chromium: Debian's chromium
// package. One browser serves the package's tests, a tab each.
var browser struct {
	once   sync.Once
	ctx    context.Context
	cancel func()
	err    error
	dir    string
}

// chromiumPath finds the browser binary; "" when there is none.
func chromiumPath() string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless_shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

func startBrowser() {
	path := chromiumPath()
	if path == "" {
		return
	}
	browser.dir, browser.err = os.MkdirTemp("", "pgworker-chromium-")
	if browser.err != nil {
		return
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox, // as root
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.UserDataDir(browser.dir),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelBrowser := chromedp.NewContext(actx)
	browser.ctx = ctx
	browser.cancel = func() {
		cancelBrowser()
		cancelAlloc()
		// The browser's children can still write there for a moment.
		for range 50 {
			if os.RemoveAll(browser.dir) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	browser.err = chromedp.Do(ctx)
}

// stopBrowser ends the shared browser, from TestMain.
func stopBrowser() {
	if browser.cancel != nil {
		browser.cancel()
	}
}

// tab is one browser tab and what its pages wrote to the console.
type tab struct {
	t   *testing.T
	ctx context.Context

	mu       sync.Mutex
	messages []chromedp.ConsoleMessage
}

// newTab opens a tab in the shared browser, skipping the test when there is
// no chromium binary.
func newTab(t *testing.T) *tab {
	t.Helper()
	browser.once.Do(startBrowser)
	if chromiumPath() == "" {
		t.Skip("no chromium binary (install Debian's chromium package, or set CHROMIUM): skipping the browser test")
	}
	if browser.err != nil {
		t.Fatalf("start chromium: %v", browser.err)
	}
	ctx, cancel := context.WithTimeout(browser.ctx, 3*time.Minute)
	ctx, cancelTab := chromedp.NewContext(ctx)
	tb := &tab{t: t, ctx: ctx}
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	messages := chromedp.Console(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			tb.mu.Lock()
			tb.messages = append(tb.messages, m)
			tb.mu.Unlock()
		}
	})
	t.Cleanup(func() {
		cancelTab()
		cancel()
		wg.Wait()
	})
	return tb
}

// do runs actions in the tab, failing the test on an error.
func (tb *tab) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	if err := chromedp.Do(tb.ctx, actions...); err != nil {
		tb.t.Fatalf("%s: %v", what, err)
	}
}

// text returns the text of the first node matching sel, read in one
// step of the page: the live part can be replaced between two.
func (tb *tab) text(sel string) string {
	tb.t.Helper()
	q, _ := json.Marshal(sel)
	s, err := chromedp.Run(tb.ctx, chromedp.Evaluate[string](`(function () { var n = document.querySelector(`+string(q)+
		`); return n ? n.innerText : "(no node " + `+string(q)+` + ")"; })()`))
	if err != nil {
		tb.t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

// eval evaluates a JavaScript expression that yields a boolean.
func (tb *tab) eval(expr string) bool {
	tb.t.Helper()
	v, err := chromedp.Run(tb.ctx, chromedp.Evaluate[bool](expr))
	if err != nil {
		tb.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// open loads a page and waits until its event stream has delivered a
// snapshot (the live part carries its generation).
func (tb *tab) open(url string) {
	tb.t.Helper()
	tb.do("open "+url, chromedp.Navigate(url), chromedp.WaitReady(chromedp.CSS("#live[data-gen]")))
}

// noConsoleErrors fails the test for each error, warning or exception the
// pages wrote to the console so far, but those allowed contains.
func (tb *tab) noConsoleErrors(allowed ...string) {
	tb.t.Helper()
	// A message of the browser log can come a moment after the page's
	// other work; a round trip to the page first lets it arrive.
	tb.eval("true")
	tb.mu.Lock()
	defer tb.mu.Unlock()
	for _, m := range tb.messages {
		if m.Type != chromedp.ConsoleError && m.Type != chromedp.ConsoleWarning && !m.IsException() {
			continue
		}
		ok := false
		for _, a := range allowed {
			ok = ok || strings.Contains(m.Text, a)
		}
		if !ok {
			tb.t.Errorf("console %s: %s (%s:%d)", m.Type, m.Text, m.URL, m.Line)
		}
	}
}

// authenticate makes the tab send the dashboard's token with every request.
func (tb *tab) authenticate(token string) {
	tb.t.Helper()
	if _, err := chromedp.Call(tb.ctx, network.Enable, network.EnableParams{}); err != nil {
		tb.t.Fatal(err)
	}
	if _, err := chromedp.Call(tb.ctx, network.SetExtraHTTPHeaders,
		network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": "Bearer " + token}}); err != nil {
		tb.t.Fatal(err)
	}
}

// screenshot writes a PNG of the viewport to path.
func (tb *tab) screenshot(path string) {
	tb.t.Helper()
	png, err := chromedp.Run(tb.ctx, chromedp.CaptureScreenshot())
	if err != nil {
		tb.t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		tb.t.Fatal(err)
	}
}
