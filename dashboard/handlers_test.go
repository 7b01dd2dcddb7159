package dashboard_test

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/pgworker/pgworker/dashboard"
	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/internal/testhelp"
)

func TestPagesShowTheDatabase(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil, nil)
	ids := s.enqueueBatch("thumbs", "photos-2026", "a.jpg", "b.jpg", "c.jpg")
	s.complete(s.claim("node1:1:0", "thumbs"), `{"outputs": []}`)
	s.fail(s.claim("node1:1:0", "thumbs"), "convert: no decode delegate\nsecond line", "stderr: bad header")
	held := s.claim("node1:1:1", "thumbs")
	s.refresh()

	_, body, hdr := s.get("/")
	for _, want := range []string{`data-queue="thumbs"`, `value="2" max="3"`, "2</span> of <span class=\"total\">3</span>",
		`<progress class="progress hidden" data-batch="photos-2026" value="2" max="3"`} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %q:\n%s", want, body)
		}
	}
	csp := hdr.Get("Content-Security-Policy")
	for _, want := range []string{"script-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q", csp, want)
		}
	}
	if hdr.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("X-Content-Type-Options = %q", hdr.Get("X-Content-Type-Options"))
	}

	_, body, _ = s.get("/workers")
	for _, want := range []string{"node1:1:1", `href="/rows/` + strconv.FormatInt(held.ID, 10) + `"`} {
		if !strings.Contains(body, want) {
			t.Errorf("workers lacks %q", want)
		}
	}

	_, body, _ = s.get("/failures")
	if !strings.Contains(body, "convert: no decode delegate") || strings.Contains(body, "second line") {
		t.Errorf("failures should group by the first line of the error:\n%s", body)
	}
	code, body, _ := s.get("/failures?group=" + url.QueryEscape("convert: no decode delegate"))
	if code != 200 || !strings.Contains(body, "stderr: bad header") || !strings.Contains(body, `href="/rows/`+strconv.FormatInt(ids[1], 10)+`"`) {
		t.Errorf("failure group: %d\n%s", code, body)
	}

	code, body, _ = s.get("/rows/" + strconv.FormatInt(ids[1], 10))
	if code != 200 || !strings.Contains(body, "exit code") || !strings.Contains(body, "convert: no decode delegate") || !strings.Contains(body, "photos-2026") {
		t.Errorf("row page: %d\n%s", code, body)
	}
	if code, _, _ := s.get("/rows/999999"); code != http.StatusNotFound {
		t.Errorf("missing row: %d, want 404", code)
	}
	if code, _, _ := s.get("/rows/x"); code != http.StatusBadRequest {
		t.Errorf("bad row id: %d, want 400", code)
	}
}

func TestHostileStringsAreText(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil, nil)
	hostile := `<script>alert(1)</script><img src=x onerror=alert(2)>"'` + "\x1b[31m\u202e"
	huge := strings.Repeat("A", 1<<20)
	queue := `<b>q</b>"`
	s.enqueueBatch(queue, `<script>alert(3)</script>`, hostile, huge)
	c := s.claim("<script>w</script>", queue)
	s.fail(c, hostile+"\n"+huge, hostile+huge)
	s.refresh()

	for _, path := range []string{"/", "/workers", "/failures", "/failures?group=" + url.QueryEscape(hostile), "/queues",
		"/rows/" + strconv.FormatInt(c.ID, 10), "/rows/" + strconv.FormatInt(c.ID+1, 10)} {
		code, body, _ := s.get(path)
		if code != 200 {
			t.Errorf("%s: %d", path, code)
		}
		for _, bad := range []string{"<script>alert", "<img src=x", "<b>q</b>", "\x1b", "\u202e"} {
			if strings.Contains(body, bad) {
				t.Errorf("%s holds %q unescaped", path, bad)
			}
		}
		if len(body) > 200_000 {
			t.Errorf("%s is %d bytes: the 1 MB strings were not cut", path, len(body))
		}
	}
}

func TestActionsAreRefusedWhenOff(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil, nil)
	ids := s.enqueue("q", "a")
	code, _ := s.post("/actions/cancel", url.Values{"id": {strconv.FormatInt(ids[0], 10)}},
		http.Header{"Authorization": {"Bearer " + testToken}})
	if code != http.StatusForbidden {
		t.Errorf("cancel on a read-only dashboard: %d, want 403", code)
	}
	if code, _ := s.post("/actions/cancel", nil, nil); code != http.StatusForbidden {
		t.Errorf("%d", code)
	}
	if code, _, _ := s.get("/actions/cancel"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET of an action: %d, want 405", code)
	}
	var state string
	s.pool.QueryRow(t.Context(), "SELECT state FROM files.files WHERE id = $1", ids[0]).Scan(&state)
	if state != "pending" {
		t.Errorf("state %s", state)
	}
}

func TestActionsNeedTokenAndCSRF(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil, &dashboard.Config{AllowActions: true, Token: testToken})
	ids := s.enqueue("q", "a", "b")
	cookie := s.csrf()
	id := strconv.FormatInt(ids[0], 10)
	form := url.Values{"id": {id}, "csrf": {cookie.Value}}
	bearer := http.Header{"Authorization": {"Bearer " + testToken}}

	for _, tc := range []struct {
		name   string
		form   url.Values
		header http.Header
		cookie bool
		want   int
	}{
		{"no auth", form, nil, true, http.StatusUnauthorized},
		{"wrong token", form, http.Header{"Authorization": {"Bearer wrong-token-0123456789"}}, true, http.StatusUnauthorized},
		{"basic with wrong password", form, http.Header{"Authorization": {basic("ann", "nope")}}, true, http.StatusUnauthorized},
		{"no CSRF cookie", form, bearer, false, http.StatusForbidden},
		{"no CSRF field", url.Values{"id": {id}}, bearer, true, http.StatusForbidden},
		{"other origin", form, http.Header{"Authorization": {"Bearer " + testToken}, "Origin": {"http://evil.example"}}, true, http.StatusForbidden},
		{"cross-site fetch", form, http.Header{"Authorization": {"Bearer " + testToken}, "Sec-Fetch-Site": {"cross-site"}}, true, http.StatusForbidden},
	} {
		var cookies []*http.Cookie
		if tc.cookie {
			cookies = append(cookies, cookie)
		}
		if code, _ := s.post("/actions/cancel", tc.form, tc.header, cookies...); code != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, code, tc.want)
		}
	}
	var n int
	s.pool.QueryRow(t.Context(), "SELECT count(*) FROM files.files WHERE state = 'cancelled'").Scan(&n)
	if n != 0 {
		t.Fatalf("%d rows cancelled by refused requests", n)
	}

	code, body := s.post("/actions/cancel", form, http.Header{"Authorization": {basic("ann", testToken)}}, cookie)
	if code != 200 || !strings.Contains(body, "Cancelled 1 of the 1 rows") {
		t.Fatalf("cancel with auth: %d\n%s", code, body)
	}
	if !strings.Contains(s.logs.String(), `"user":"ann"`) {
		t.Errorf("the action is not logged with its user:\n%s", s.logs.String())
	}
	code, body = s.post("/actions/retry", form, bearer, cookie)
	if code != 200 || !strings.Contains(body, "Requeued 1 of the 1 rows") {
		t.Fatalf("retry: %d\n%s", code, body)
	}
	for _, a := range []string{"pause", "resume"} {
		code, body = s.post("/actions/"+a, url.Values{"queue": {"q"}, "csrf": {cookie.Value}}, bearer, cookie)
		if code != 200 {
			t.Fatalf("%s: %d\n%s", a, code, body)
		}
	}
	code, _ = s.post("/actions/resume", url.Values{"queue": {"nope"}, "csrf": {cookie.Value}}, bearer, cookie)
	if code != http.StatusBadRequest {
		t.Errorf("resume of a missing queue: %d, want 400", code)
	}
}

func TestNewRefusesActionsWithoutToken(t *testing.T) {
	t.Parallel()
	if _, err := dashboard.New(nil, &dashboard.Config{AllowActions: true, Token: "short"}); err != dashboard.ErrNoToken {
		t.Fatalf("New: %v, want ErrNoToken", err)
	}
}

func basic(user, pass string) string {
	r, _ := http.NewRequest("GET", "/", nil)
	r.SetBasicAuth(user, pass)
	return r.Header.Get("Authorization")
}

// TestReaderRoleIsEnough runs the dashboard as a login that has only
// pgworker_reader: every page works, and an action says which role it needs.
func TestReaderRoleIsEnough(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	admin := pgtest.PoolFor(t, dbURL)
	role := "dashboard_reader_" + testhelp.RandomHex(4)
	if _, err := admin.Exec(t.Context(), "CREATE ROLE "+role+" LOGIN IN ROLE pgworker_reader"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	s := newStack(t, pgtest.PoolFor(t, u.String()), &dashboard.Config{AllowActions: true, Token: testToken})
	var id int64
	if err := admin.QueryRow(t.Context(), "INSERT INTO files.files (queue, source) VALUES ('q', 'a') RETURNING id").Scan(&id); err != nil {
		t.Fatal(err)
	}
	s.refresh()
	for _, path := range []string{"/", "/workers", "/failures", "/failures?group=x", "/queues", "/rows/" + strconv.FormatInt(id, 10)} {
		if code, body, _ := s.get(path); code != 200 {
			t.Errorf("%s as %s: %d\n%s", path, role, code, body)
		}
	}
	cookie := s.csrf()
	code, body := s.post("/actions/cancel", url.Values{"id": {strconv.FormatInt(id, 10)}, "csrf": {cookie.Value}},
		http.Header{"Authorization": {"Bearer " + testToken}}, cookie)
	if code != http.StatusBadGateway || !strings.Contains(body, "pgworker_admin") {
		t.Errorf("cancel as a reader: %d, want 502 naming pgworker_admin\n%s", code, body)
	}
}

func TestLogin(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil, &dashboard.Config{AllowActions: true, Token: testToken})
	resp, err := http.Get(s.url("/login"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic ") {
		t.Errorf("login without credentials: %s, WWW-Authenticate %q", resp.Status, resp.Header.Get("WWW-Authenticate"))
	}
	req, _ := http.NewRequest("GET", s.url("/login?return=/queues"), nil)
	req.SetBasicAuth("ann", testToken)
	resp, err = http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/queues" {
		t.Errorf("login: %s to %q, want 303 to /queues", resp.Status, resp.Header.Get("Location"))
	}
	req, _ = http.NewRequest("GET", s.url("/login?return=//evil.example/x"), nil)
	req.SetBasicAuth("ann", testToken)
	resp, err = http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); loc != "/" {
		t.Errorf("login returns to %q, want / for another site", loc)
	}
	ro := newStack(t, nil, nil)
	if code, _, _ := ro.get("/login"); code != http.StatusNotFound {
		t.Errorf("login on a read-only dashboard: %d, want 404", code)
	}
}

// TestWorkersPageSumsUpLargeFleets: past 200 slots the Workers page lists
// the nodes and the slots that stand out; each node's page lists all its
// slots, and its event stream follows that node alone.
func TestWorkersPageSumsUpLargeFleets(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil, nil)
	s.exec(`INSERT INTO files.workers (worker_id, node, pid, slot, state, version, last_heartbeat_at)
	        SELECT 'node-' || (g / 16) || ':100:' || (g % 16), 'node-' || (g / 16), 100, g % 16, 'active', '0.9.0',
	               CASE WHEN g = 37 THEN now() - interval '10 seconds' ELSE now() END
	        FROM generate_series(0, 319) g`)
	s.refresh()
	_, body, _ := s.get("/workers")
	if !strings.Contains(body, `<table class="nodes">`) || !strings.Contains(body, `data-worker="node-2:100:5"`) ||
		strings.Contains(body, `data-worker="node-2:100:4"`) || strings.Count(body, `class="node-line`) != 20 {
		t.Errorf("the Workers page of 320 slots should list 20 nodes and the silent slot node-2:100:5 alone:\n%.3000s", body)
	}
	_, body, _ = s.get("/workers?node=node-3")
	if n := strings.Count(body, `data-worker="node-3:`); n != 16 || strings.Contains(body, `data-worker="node-2:`) {
		t.Errorf("node-3's page lists %d of its 16 slots, or others'", n)
	}
	ev := s.openEvents("workers&node=node-3").await(t, "node-3's stream", func(sseEvent) bool { return true })
	if n := strings.Count(ev.HTML, `data-worker="node-3:`); n != 16 || strings.Contains(ev.HTML, `data-worker="node-2:`) {
		t.Errorf("node-3's stream lists %d of its 16 slots, or others'", n)
	}
}

// A slot whose last row's outcome waits to be recorded while it runs the
// next holds two running rows: the Workers page lists both and counts the
// slot once, busy once.
func TestWorkersPageCountsASlotOnce(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil, nil)
	s.enqueue("q", "a", "b")
	first, second := s.claim("w-1", "q"), s.claim("w-1", "q")
	s.refresh()
	_, body, _ := s.get("/workers")
	for _, want := range []string{`<span class="big">1</span> live slots`, `<span class="big">1</span> busy`, "1 active · 1 busy",
		`href="/rows/` + strconv.FormatInt(first.ID, 10) + `"`, `href="/rows/` + strconv.FormatInt(second.ID, 10) + `"`} {
		if !strings.Contains(body, want) {
			t.Errorf("the Workers page lacks %q:\n%.3000s", want, body)
		}
	}
	if n := strings.Count(body, `data-worker="w-1"`); n != 2 {
		t.Errorf("%d lines of slot w-1, want one per running row (2)", n)
	}
}
