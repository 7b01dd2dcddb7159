package dashboard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/dashboard"
	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/internal/testhelp"
)

const testToken = "test-token-0123456789abcdef"

// stack is one test's dashboard on a database of its own, served over
// HTTP on a loopback port.
type stack struct {
	t    testing.TB
	pool *pgxpool.Pool
	dash *dashboard.Dashboard
	srv  *httptest.Server
	logs *testhelp.SyncBuffer
}

// newStack starts a dashboard with cfg (nil: defaults with quick
// refreshes) on pool (nil: a fresh database).
func newStack(t testing.TB, pool *pgxpool.Pool, cfg *dashboard.Config) *stack {
	t.Helper()
	if pool == nil {
		pool = pgtest.Pool(t)
	}
	if cfg == nil {
		cfg = &dashboard.Config{}
	}
	s := &stack{t: t, pool: pool, logs: &testhelp.SyncBuffer{}}
	if cfg.Logger == nil {
		cfg.Logger = newLogger(s.logs)
	}
	if cfg.Interval == 0 {
		cfg.Interval = 300 * time.Millisecond
	}
	if cfg.MinInterval == 0 {
		cfg.MinInterval = 50 * time.Millisecond
	}
	if cfg.SlowInterval == 0 {
		cfg.SlowInterval = 300 * time.Millisecond
	}
	d, err := dashboard.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.dash = d
	s.srv = httptest.NewServer(d)
	t.Cleanup(s.srv.Close)
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return s
}

func (s *stack) url(path string) string { return s.srv.URL + path }

func (s *stack) exec(sql string, args ...any) {
	s.t.Helper()
	if _, err := s.pool.Exec(context.Background(), sql, args...); err != nil {
		s.t.Fatalf("%s: %v", sql, err)
	}
}

// enqueue inserts rows and returns their ids.
func (s *stack) enqueue(queue string, sources ...string) []int64 {
	s.t.Helper()
	return s.enqueueBatch(queue, "", sources...)
}

// enqueueBatch inserts rows in batch ("" for none) and returns their ids.
func (s *stack) enqueueBatch(queue, batch string, sources ...string) []int64 {
	s.t.Helper()
	var ids []int64
	for _, src := range sources {
		var id int64
		if err := s.pool.QueryRow(context.Background(),
			`INSERT INTO files.files (queue, source, batch) VALUES ($1, $2, nullif($3, '')) RETURNING id`, queue, src, batch).Scan(&id); err != nil {
			s.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// claimed is a row a test worker holds.
type claimed struct {
	ID      int64
	Worker  string
	Attempt int32
	Token   string
}

// claim claims the next row of queue for worker through the SQL API.
func (s *stack) claim(worker, queue string) claimed {
	s.t.Helper()
	c := claimed{Worker: worker}
	err := s.pool.QueryRow(context.Background(),
		`SELECT id, attempt, claim_token FROM files.claim($1, ARRAY[$2], 1, $3)`, worker, queue, "key-of-"+worker+"-0123456789").
		Scan(&c.ID, &c.Attempt, &c.Token)
	if err != nil {
		s.t.Fatalf("claim %s: %v", queue, err)
	}
	return c
}

func (s *stack) complete(c claimed, result string) {
	s.t.Helper()
	var ok bool
	if err := s.pool.QueryRow(context.Background(), `SELECT files.complete($1, $2, $3, $4, $5::jsonb, '{"exit_code": 0, "duration_ms": 18250}')`,
		c.ID, c.Worker, c.Attempt, c.Token, result).Scan(&ok); err != nil || !ok {
		s.t.Fatalf("complete %d: %v %v", c.ID, ok, err)
	}
}

func (s *stack) fail(c claimed, msg, stderr string) {
	s.t.Helper()
	report, _ := json.Marshal(map[string]any{"exit_code": 3, "duration_ms": 4100, "stderr_tail": stderr})
	var ok bool
	if err := s.pool.QueryRow(context.Background(), `SELECT files.fail($1, $2, $3, $4, $5, false, $6)`,
		c.ID, c.Worker, c.Attempt, c.Token, msg, report).Scan(&ok); err != nil || !ok {
		s.t.Fatalf("fail %d: %v %v", c.ID, ok, err)
	}
}

// refresh makes the dashboard show what the database holds now.
func (s *stack) refresh() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.dash.Refresh(ctx); err != nil {
		s.t.Fatalf("refresh: %v", err)
	}
}

// state returns the state of row id.
func (s *stack) state(id int64) string {
	s.t.Helper()
	var st string
	if err := s.pool.QueryRow(context.Background(), "SELECT state FROM files.files WHERE id = $1", id).Scan(&st); err != nil {
		s.t.Fatal(err)
	}
	return st
}

// get fetches a page and returns its status and body.
func (s *stack) get(path string) (int, string, http.Header) {
	s.t.Helper()
	resp, err := http.Get(s.url(path))
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

// post sends a form with the given headers and cookies, without
// following redirects.
func (s *stack) post(path string, form url.Values, header http.Header, cookies ...*http.Cookie) (int, string) {
	s.t.Helper()
	req, err := http.NewRequest("POST", s.url(path), strings.NewReader(form.Encode()))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		req.Header[k] = v
	}
	for _, c := range cookies {
		req.AddCookie(c)
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// csrf loads a page and returns its CSRF cookie.
func (s *stack) csrf() *http.Cookie {
	s.t.Helper()
	resp, err := http.Get(s.url("/queues"))
	if err != nil {
		s.t.Fatal(err)
	}
	resp.Body.Close()
	for _, c := range resp.Cookies() {
		if c.Name == "pgworker_csrf" {
			return c
		}
	}
	s.t.Fatal("no CSRF cookie")
	return nil
}

// sse is an open event stream.
type sse struct {
	resp *http.Response
	r    *bufio.Reader
}

type sseEvent struct {
	Gen  uint64 `json:"gen"`
	OK   bool   `json:"ok"`
	HTML string `json:"html"`
}

func (s *stack) openEvents(page string) *sse {
	s.t.Helper()
	// A stream that stops sending fails the test rather than hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	s.t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, "GET", s.url("/events?page="+page), nil)
	if err != nil {
		s.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		s.t.Fatalf("events: %s", resp.Status)
	}
	s.t.Cleanup(func() { resp.Body.Close() })
	return &sse{resp: resp, r: bufio.NewReader(resp.Body)}
}

// next reads the next snapshot event.
func (e *sse) next() (sseEvent, error) {
	var data string
	for {
		line, err := e.r.ReadString('\n')
		if err != nil {
			return sseEvent{}, err
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, "data: "):
			data = strings.TrimPrefix(line, "data: ")
		case line == "" && data != "":
			var ev sseEvent
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				return sseEvent{}, fmt.Errorf("event %q: %w", data, err)
			}
			return ev, nil
		}
	}
}

// await reads events until one satisfies cond.
func (e *sse) await(t testing.TB, what string, cond func(sseEvent) bool) sseEvent {
	t.Helper()
	for {
		ev, err := e.next()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if cond(ev) {
			return ev
		}
	}
}
