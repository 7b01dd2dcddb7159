package listener_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/internal/testhelp"
	"github.com/pgworker/pgworker/listener"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// patience bounds every wait for an event: generous, as a loaded machine is
// slow, and never spent by a test that passes.
const patience = time.Minute

// newListener returns a listener for cfg. Subscribe before run: the first
// connect rings only the doorbells that exist by then.
func newListener(t *testing.T, cfg *listener.Config) *listener.Listener {
	t.Helper()
	l, err := listener.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// run runs l until the end of the test.
func run(t *testing.T, l *listener.Listener) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := l.Listen(ctx); err != nil {
			t.Errorf("Listen: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// ring waits for a doorbell.
func ring(t *testing.T, s *listener.Subscription, what string) {
	t.Helper()
	select {
	case <-s.Doorbell():
	case <-time.After(patience):
		t.Fatalf("no ring: %s", what)
	}
}

func notify(t *testing.T, pool *pgxpool.Pool, channel, payload string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), "SELECT pg_notify($1, $2)", channel, payload); err != nil {
		t.Fatal(err)
	}
}

// drain empties a doorbell of rings that an earlier event left.
func drain(s *listener.Subscription) {
	rung(s)
}

func rung(s *listener.Subscription) bool {
	select {
	case <-s.Doorbell():
		return true
	default:
		return false
	}
}

func TestDoorbellsCoalesceAndFilter(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	// No health checks: a reconnect would ring b.
	l := newListener(t, &listener.Config{URL: url, PingInterval: time.Hour})

	a := l.Subscribe("a")
	defer a.Close()
	b := l.Subscribe("b")
	defer b.Close()
	all := l.Subscribe()
	defer all.Close()
	marker := l.Subscribe("marker")
	defer marker.Close()
	run(t, l)
	ring(t, a, "connect")
	ring(t, b, "connect")
	ring(t, all, "connect")
	ring(t, marker, "connect")

	// Fifty notifications for a, each in its own transaction (PostgreSQL
	// folds identical ones within a transaction), then a marker: once the
	// marker rang, everything before it was dispatched.
	for range 50 {
		notify(t, pool, listener.ChannelPending, "a")
	}
	notify(t, pool, listener.ChannelPending, "marker")
	ring(t, marker, "marker")

	if !rung(a) {
		t.Fatal("a: no ring after 50 notifications")
	}
	if rung(a) {
		t.Fatal("a: rings did not coalesce into one")
	}
	if rung(b) {
		t.Fatal("b rang for queue a")
	}
	if !rung(all) {
		t.Fatal("an unfiltered subscriber did not ring")
	}
	if s := l.Stats(); s.Notifications < 51 || s.Connects != 1 {
		t.Fatalf("stats: %+v, want at least 51 notifications on one connection", s)
	}
}

func TestSlowSubscriberDoesNotBlockOthers(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	l := newListener(t, &listener.Config{URL: url})

	slow := l.Subscribe() // never reads
	defer slow.Close()
	fast := l.Subscribe()
	defer fast.Close()
	run(t, l)
	ring(t, fast, "connect")
	for i := range 20 {
		notify(t, pool, listener.ChannelPending, "q")
		ring(t, fast, "notification "+string(rune('a'+i)))
	}
	if n := len(slow.Doorbell()); n != 1 {
		t.Fatalf("slow subscriber holds %d rings, want 1", n)
	}
}

func TestReconnectRingsEveryDoorbell(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	// No health checks: the only reconnect is the one the test causes.
	l := newListener(t, &listener.Config{URL: url, BackoffMin: 10 * time.Millisecond, PingInterval: time.Hour})

	a := l.Subscribe("a")
	defer a.Close()
	b := l.Subscribe("b")
	defer b.Close()
	run(t, l)
	ring(t, a, "connect")
	ring(t, b, "connect")

	terminateListener(t, pool)
	ring(t, a, "reconnect")
	ring(t, b, "reconnect")
	if s := l.Stats(); s.Reconnects < 1 || !s.Connected {
		t.Fatalf("stats after reconnect: %+v", s)
	}
}

// terminateListener ends the listener's backend.
func terminateListener(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `
		SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'pgworker listener'`).Scan(&n)
	if err != nil || n != 1 {
		t.Fatalf("terminate the listener's backend: %d terminated, %v", n, err)
	}
}

func TestControlMessages(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	l := newListener(t, &listener.Config{URL: url})

	got := make(chan listener.Control, 1)
	remove := l.OnControl(func(c listener.Control) { got <- c })
	defer remove()
	sub := l.Subscribe()
	defer sub.Close()
	run(t, l)
	ring(t, sub, "connect")

	msg, _ := json.Marshal(map[string]any{"op": "cancel", "file_id": 42, "worker_id": "n:1:0"})
	notify(t, pool, listener.ChannelControl, string(msg))
	select {
	case c := <-got:
		if c != (listener.Control{Op: "cancel", FileID: 42, WorkerID: "n:1:0"}) {
			t.Fatalf("got %+v", c)
		}
	case <-time.After(patience):
		t.Fatal("no control message")
	}
}

// A peer that vanishes without closing (a failover, a cable pulled) leaves a
// half-open connection: the ping on the idle connection must notice.
func TestHealthCheckReplacesHalfOpenConnection(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	proxy := pgtest.StartProxy(t, url)
	l := newListener(t, &listener.Config{
		URL:          proxy.URL(t, url),
		PingInterval: 100 * time.Millisecond,
		PingTimeout:  time.Second,
		BackoffMin:   10 * time.Millisecond,
		BackoffMax:   100 * time.Millisecond,
	})
	sub := l.Subscribe()
	defer sub.Close()
	run(t, l)
	ring(t, sub, "connect")

	proxy.Freeze()
	waitFor(t, "the listener to notice the silent connection", func() bool { return !l.Stats().Connected })
	// No connect gets through a frozen proxy: a ring now is an old one.
	drain(sub)
	proxy.Restore()
	ring(t, sub, "reconnect after the half-open connection")
	if s := l.Stats(); s.Pings == 0 || s.Reconnects < 1 {
		t.Fatalf("stats: %+v", s)
	}
}

// An outage is one warning, however many attempts it takes, and the end of it
// rings every doorbell.
func TestOutageLogsOnceAndRingsAfter(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	proxy := pgtest.StartProxy(t, url)
	var logs syncBuffer
	l := newListener(t, &listener.Config{
		URL:        proxy.URL(t, url),
		Logger:     slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		BackoffMin: time.Millisecond,
		BackoffMax: 5 * time.Millisecond,
		// No health checks: the outage is the only one.
		PingInterval: time.Hour,
	})
	sub := l.Subscribe()
	defer sub.Close()
	run(t, l)
	ring(t, sub, "connect")

	proxy.Refuse()
	proxy.Drop()
	waitFor(t, "twenty failed attempts", func() bool { return l.Stats().Failures >= 20 })
	proxy.Restore()
	ring(t, sub, "reconnect after the outage")
	waitFor(t, "the recovery line", func() bool { return strings.Contains(logs.String(), "listening again") })

	out := logs.String()
	if n := strings.Count(out, "level=WARN"); n != 1 {
		t.Fatalf("%d warnings for one outage, want 1:\n%s", n, out)
	}
}

func TestNewNeedsURL(t *testing.T) {
	if _, err := listener.New(nil); err == nil || !strings.Contains(err.Error(), "missing database URL") {
		t.Fatalf("New(nil) = %v", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testhelp.WaitFor(t, patience, what, cond)
}

type syncBuffer = testhelp.SyncBuffer

// Any role that can connect can send on files_control: malformed messages are
// counted, not logged as warnings (a flood of them must not flood the log).
func TestMalformedControlMessagesAreCounted(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	var logs syncBuffer
	l := newListener(t, &listener.Config{
		URL:          url,
		Logger:       slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		PingInterval: time.Hour,
	})
	got := make(chan listener.Control, 1)
	remove := l.OnControl(func(c listener.Control) { got <- c })
	defer remove()
	sub := l.Subscribe()
	defer sub.Close()
	run(t, l)
	ring(t, sub, "connect")

	const forged = 20
	for range forged {
		notify(t, pool, listener.ChannelControl, "\x1b]0;not json")
	}
	// Notifications of one session arrive in commit order: the valid message
	// comes after every malformed one.
	notify(t, pool, listener.ChannelControl, `{"op":"cancel","file_id":1,"worker_id":"n:1:0"}`)
	select {
	case <-got:
	case <-time.After(patience):
		t.Fatal("no control message")
	}
	if n := l.Stats().Malformed; n != forged {
		t.Errorf("Malformed = %d, want %d", n, forged)
	}
	if out := logs.String(); out != "" {
		t.Errorf("malformed messages were logged:\n%s", out)
	}
}

// OnConnect hooks run after the first LISTEN and after every reconnect.
func TestOnConnectAfterEveryReconnect(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	l := newListener(t, &listener.Config{URL: url, BackoffMin: 10 * time.Millisecond, PingInterval: time.Hour})
	connected := make(chan struct{}, 4)
	remove := l.OnConnect(func() { connected <- struct{}{} })
	defer remove()
	run(t, l)

	for i, what := range []string{"connect", "reconnect"} {
		if i > 0 {
			terminateListener(t, pool)
		}
		select {
		case <-connected:
		case <-time.After(patience):
			t.Fatalf("no hook call after the %s", what)
		}
	}
}

// A quiet listener hears nothing: a notification sent while it is quiet is
// lost, and when the spell ends (here because its subscriber withdrew the
// request) it listens again and rings every doorbell. It goes quiet only
// once every subscriber asked, and never without a session.
func TestQuiet(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	l := newListener(t, &listener.Config{URL: url, PingInterval: time.Hour})
	idle := newListener(t, &listener.Config{URL: url}).Subscribe()
	defer idle.Close()
	if idle.Quiet(time.Now().Add(time.Hour)) {
		t.Fatal("Quiet before Listen: true, want false")
	}
	a := l.Subscribe()
	defer a.Close()
	b := l.Subscribe("q")
	defer b.Close()
	run(t, l)
	ring(t, a, "connect")
	ring(t, b, "connect")

	if b.Quiet(time.Now().Add(patience)) {
		t.Fatal("Quiet while a still listens: true, want false")
	}
	if !a.Quiet(time.Now().Add(patience)) {
		t.Fatal("Quiet of the last subscriber: false")
	}
	waitFor(t, "the quiet spell", func() bool { return l.Stats().Quiets == 1 })
	heard := l.Stats().Notifications
	notify(t, pool, listener.ChannelPending, "q")
	notify(t, pool, listener.ChannelControl, `{"op":"cancel","file_id":1,"worker_id":"n:1:0"}`)
	if a.Quiet(time.Now()) {
		t.Fatal("a withdrawn request: true, want false")
	}
	ring(t, a, "the end of the spell")
	ring(t, b, "the end of the spell")
	if s := l.Stats(); s.Notifications != heard || s.Quiets != 1 || !s.Connected || s.Connects != 1 {
		t.Fatalf("after the spell: %+v, want %d notifications (those sent while quiet are lost)", s, heard)
	}

	// Listening again, though b still asks to be left alone.
	notify(t, pool, listener.ChannelPending, "q")
	ring(t, b, "a notification after the spell")
	if n := l.Stats().Notifications; n != heard+1 {
		t.Fatalf("notifications after the spell: %d, want %d", n, heard+1)
	}
}

// A session lost during a quiet spell is found out when the spell ends: the
// LISTEN fails, and the listener connects again and rings every doorbell.
func TestQuietSessionLost(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	l := newListener(t, &listener.Config{URL: url, BackoffMin: 10 * time.Millisecond, PingInterval: time.Hour})
	sub := l.Subscribe()
	defer sub.Close()
	run(t, l)
	ring(t, sub, "connect")

	if !sub.Quiet(time.Now().Add(patience)) {
		t.Fatal("Quiet while listening: false")
	}
	waitFor(t, "the quiet spell", func() bool { return l.Stats().Quiets == 1 })
	terminateListener(t, pool)
	sub.Quiet(time.Now())
	ring(t, sub, "the reconnect")
	if s := l.Stats(); s.Connects != 2 || s.Failures != 1 || !s.Connected {
		t.Fatalf("after the spell on a lost session: %+v", s)
	}
}
