package dashboard_test

import (
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pgworker/pgworker/dashboard"
	"github.com/pgworker/pgworker/internal/pgtest"
)

func TestBrowserPagesShowTheDatabaseAndFollowIt(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil, nil)
	ids := s.enqueueBatch("thumbs", "scans-2026", "a.jpg", "b.jpg", "c.jpg", "d.jpg")
	s.complete(s.claim("vm:41:0", "thumbs"), `{"outputs": []}`)
	s.fail(s.claim("vm:41:0", "thumbs"), "convert: no decode delegate for this image format", "convert: improper image header")
	held := s.claim("vm:41:1", "thumbs")
	s.refresh()
	tb := newTab(t)

	tb.open(s.url("/"))
	if !tb.eval(`(function () { var p = document.querySelector('progress[data-queue="thumbs"]'); return p.value === 2 && p.max === 4; })()`) {
		t.Errorf("the progress bar does not show 2 of 4 finished: %s", tb.text(`article[data-queue="thumbs"]`))
	}
	tb.do("the chart", chromedp.WaitReady(chromedp.CSS("#chart .uplot")))
	tb.eval(`window.pgwMarker = 1, true`)
	s.complete(held, `{"outputs": []}`)
	tb.do("the progress bars of the queue and the batch to follow the row that finished",
		chromedp.WaitReady(chromedp.CSS(`progress[data-queue="thumbs"][value="3"]`)),
		chromedp.WaitReady(chromedp.CSS(`progress[data-batch="scans-2026"][value="3"]`)))
	if !tb.eval(`window.pgwMarker === 1`) {
		t.Error("the page was reloaded: it should have changed in place")
	}
	if got := tb.text(`article[data-queue="thumbs"] .n-done`); got != "2" {
		t.Errorf("done = %q, want 2", got)
	}

	tb.open(s.url("/workers"))
	if got := tb.text(`tr[data-worker="vm:41:1"]`); !strings.Contains(got, "idle") {
		t.Errorf("slot vm:41:1: %q, want idle", got)
	}

	tb.open(s.url("/failures"))
	if got := tb.text("table.groups"); !strings.Contains(got, "convert: no decode delegate") {
		t.Errorf("failure groups: %q", got)
	}
	tb.do("open the group", chromedp.Click(chromedp.CSS("table.groups a")), chromedp.WaitReady(chromedp.CSS("#group")))
	tb.do("show the stderr tail", chromedp.Click(chromedp.CSS("#group details summary")))
	if got := tb.text("#group pre.stderr"); !strings.Contains(got, "improper image header") {
		t.Errorf("stderr tail: %q", got)
	}

	tb.open(s.url("/rows/" + strconv.FormatInt(ids[1], 10)))
	if got := tb.text("table.attempts"); !strings.Contains(got, "failed") || !strings.Contains(got, "3") {
		t.Errorf("attempts of row %d: %q", ids[1], got)
	}
	tb.open(s.url("/queues"))
	if got := tb.text("table.queue-controls"); !strings.Contains(got, "thumbs") {
		t.Errorf("queue controls: %q", got)
	}
	tb.noConsoleErrors()
}

func TestBrowserHostileStringsAreText(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil, nil)
	xss := `<script>window.pgwXSS=1</script><img src=x onerror="window.pgwXSS=2">`
	queue := `<svg onload="window.pgwXSS=3">`
	huge := strings.Repeat("Z", 1<<20)
	s.enqueueBatch(queue, `<script>window.pgwXSS=5</script>`, xss+"\x07\x1b[2J", huge, xss)
	failed := s.claim(`<b onmouseover="window.pgwXSS=4">w</b>`, queue)
	s.fail(failed, xss+"\n"+huge, xss+"\u202e"+huge)
	s.claim(`<i>slot</i>`, queue) // holds the row of the 1 MB source
	s.refresh()
	tb := newTab(t)

	for _, path := range []string{"/", "/workers", "/failures", "/failures?group=" + url.QueryEscape(xss),
		"/queues", "/rows/" + strconv.FormatInt(failed.ID, 10), "/rows/" + strconv.FormatInt(failed.ID+1, 10)} {
		tb.open(s.url(path))
		if !tb.eval(`window.pgwXSS === undefined`) {
			t.Errorf("%s: a hostile string ran", path)
		}
		if !tb.eval(`document.querySelectorAll("main img, main svg:not(.uplot svg), main script, main b, main i").length === 0`) {
			t.Errorf("%s: a hostile string became markup", path)
		}
		if !tb.eval(`document.body.innerText.includes("<script>window.pgwXSS=1</script>") ||
		             document.body.innerText.includes('<svg onload="window.pgwXSS=3">') ||
		             document.body.innerText.includes("<i>slot</i>")`) {
			t.Errorf("%s: the hostile strings are not shown as text", path)
		}
		if !tb.eval(`document.documentElement.outerHTML.length < 300000`) {
			t.Errorf("%s: the 1 MB strings were not cut", path)
		}
	}
	tb.noConsoleErrors()
}

func TestBrowserActionsNeedAuthentication(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil, &dashboard.Config{AllowActions: true, Token: testToken})
	s.enqueue("scans", "a.tif")
	c := s.claim("vm:7:0", "scans")
	s.fail(c, "ocr: timeout", "")
	s.refresh()
	tb := newTab(t)
	group := s.url("/failures?group=" + url.QueryEscape("ocr: timeout"))
	box := chromedp.CSS(`input[name="id"][value="` + strconv.FormatInt(c.ID, 10) + `"]`)

	tb.open(group)
	resp, err := chromedp.RunResponse(tb.ctx, chromedp.Click(box), chromedp.Click(chromedp.CSS("#retry-selected")))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != 401 {
		t.Errorf("retry without the token: %d, want 401", resp.Status)
	}
	if st := s.state(c.ID); st != "failed" {
		t.Fatalf("row %d is %s after a refused retry", c.ID, st)
	}

	tb.authenticate(testToken)
	tb.open(group)
	resp, err = chromedp.RunResponse(tb.ctx, chromedp.Click(box), chromedp.Click(chromedp.CSS("#retry-selected")))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != 200 || !strings.Contains(tb.text("main"), "Requeued 1 of the 1 rows") {
		t.Errorf("retry with the token: %d %q", resp.Status, tb.text("main"))
	}
	if st := s.state(c.ID); st != "pending" {
		t.Errorf("row %d is %s after the retry, want pending", c.ID, st)
	}

	tb.open(s.url("/queues"))
	tb.do("pause", chromedp.Click(chromedp.CSS(`tr[data-queue="scans"] button.pause`)), chromedp.WaitReady(chromedp.CSS("#back")))
	if !strings.Contains(tb.text("main"), `Paused queue "scans"`) {
		t.Errorf("pause: %q", tb.text("main"))
	}
	tb.open(s.url("/queues"))
	tb.do("resume", chromedp.Click(chromedp.CSS(`tr[data-queue="scans"] button.resume`)), chromedp.WaitReady(chromedp.CSS("#back")))
	var paused bool
	if err := s.pool.QueryRow(t.Context(), "SELECT paused FROM files.queues WHERE queue = 'scans'").Scan(&paused); err != nil || paused {
		t.Errorf("queue scans paused = %v (%v) after resume", paused, err)
	}
	if !strings.Contains(s.logs.String(), `"action":"resume","user":"bearer token"`) {
		t.Errorf("the actions are not logged with who took them:\n%s", s.logs.String())
	}
	tb.noConsoleErrors("401")
}

func TestBrowserOutageBannerAndRecovery(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	proxy := pgtest.StartProxy(t, dbURL)
	s := newStack(t, pgtest.PoolFor(t, proxy.URL(t, dbURL)), &dashboard.Config{QueryTimeout: 5 * time.Second})
	ids := s.enqueue("q", "a")
	s.refresh()
	tb := newTab(t)

	tb.open(s.url("/"))
	proxy.Refuse()
	proxy.Drop()
	tb.do("the outage banner", chromedp.WaitVisible(chromedp.CSS("#banner")))
	if !strings.Contains(tb.text("#banner"), "does not answer") || !tb.eval(`!!document.querySelector('article[data-queue="q"]')`) {
		t.Errorf("during the outage: banner %q; the last data should stay", tb.text("#banner"))
	}
	row := s.url("/rows/" + strconv.FormatInt(ids[0], 10))
	tb.open(row)
	tb.do("the row page's banner", chromedp.WaitVisible(chromedp.CSS("#banner")))
	proxy.Restore()
	tb.do("the row page to come back by itself", chromedp.WaitReady(chromedp.CSS(".row-head")))
	tb.open(s.url("/"))
	tb.do("the banner to go", chromedp.WaitNotPresent(chromedp.CSS("#banner")))
	tb.noConsoleErrors("503")
}
