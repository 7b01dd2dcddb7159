package listener_test

// These tests drive github.com/jackc/pgxlisten through the faults that
// listener's own tests cover, set up the way the package would be built on it:
// a Connect hook with TCP keepalives and a BacklogHandler that rings after
// every (re)connect. They record why the package is written on pgconn (see
// the package doc); when one of them fails, pgxlisten has changed, and
// building on it is worth another look.

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgxlisten"

	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/listener"
)

// probe is a pgxlisten.Listener on both channels that records what happens.
type probe struct {
	urls      []string // urls[i]: where to connect once i sessions reached LISTEN; the last is reused
	keepAlive net.KeepAliveConfig

	mu       sync.Mutex
	listens  int      // sessions that reached LISTEN (backlog calls)
	payloads []string // notifications received on ChannelPending
	errs     []error  // what LogError received
}

type probeStats struct {
	listens  int
	payloads []string
	errs     []error
}

func (p *probe) stats() probeStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return probeStats{p.listens, slices.Clone(p.payloads), slices.Clone(p.errs)}
}

func (p *probe) connect(ctx context.Context) (*pgx.Conn, error) {
	p.mu.Lock()
	url := p.urls[min(p.listens, len(p.urls)-1)]
	p.mu.Unlock()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnectTimeout = 5 * time.Second
	cfg.DialFunc = (&net.Dialer{Timeout: cfg.ConnectTimeout, KeepAliveConfig: p.keepAlive}).DialContext
	cfg.RuntimeParams["application_name"] = "pgxlisten probe"
	return pgx.ConnectConfig(ctx, cfg)
}

func (p *probe) HandleNotification(_ context.Context, n *pgconn.Notification, _ *pgx.Conn) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.payloads = append(p.payloads, n.Payload)
	return nil
}

// HandleBacklog is where the doorbells would ring after a (re)connect.
func (p *probe) HandleBacklog(context.Context, string, *pgx.Conn) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.listens++
	return nil
}

func (p *probe) logError(_ context.Context, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs = append(p.errs, err)
}

// startProbe runs p until the end of the test, reconnecting after delay
// (pgxlisten's default is a minute).
func startProbe(t *testing.T, p *probe, delay time.Duration) {
	t.Helper()
	l := &pgxlisten.Listener{Connect: p.connect, LogError: p.logError, ReconnectDelay: delay}
	l.Handle(listener.ChannelPending, p)
	l.Handle(listener.ChannelControl, pgxlisten.HandlerFunc(
		func(context.Context, *pgconn.Notification, *pgx.Conn) error { return nil }))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := l.Listen(ctx); !errors.Is(err, context.Canceled) {
			t.Errorf("pgxlisten Listen: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// A connection whose peer went silent behind a middlebox that keeps the TCP
// session open (PgBouncer, HAProxy, a cloud load balancer during a failover;
// here the proxy, frozen) looks healthy to a client that only waits: the
// middlebox answers TCP keepalives, and the server has nothing to send.
// listener pings the idle connection and replaces it; pgxlisten waits in
// WaitForNotification, which owns the connection, so no hook can ping it, and
// it stays deaf although a new connection would work.
func TestPgxlistenStaysOnHalfOpenConnection(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	ourProxy, theirProxy := pgtest.StartProxy(t, url), pgtest.StartProxy(t, url)

	ours := newListener(t, &listener.Config{
		URL:          ourProxy.URL(t, url),
		PingInterval: 100 * time.Millisecond,
		PingTimeout:  time.Second,
		BackoffMin:   10 * time.Millisecond,
		BackoffMax:   100 * time.Millisecond,
	})
	sub := ours.Subscribe("q")
	defer sub.Close()
	run(t, ours)
	// Until it listens, pgxlisten connects through the proxy; after that,
	// straight to the server, as a new connection through a failed-over
	// middlebox would. Keepalives as short as Linux allows: a second idle,
	// two probes a second apart.
	theirs := &probe{
		urls:      []string{theirProxy.URL(t, url), url},
		keepAlive: net.KeepAliveConfig{Enable: true, Idle: time.Second, Interval: time.Second, Count: 2},
	}
	startProbe(t, theirs, 10*time.Millisecond)
	ring(t, sub, "connect")
	waitFor(t, "pgxlisten to listen", func() bool { return theirs.stats().listens >= 1 })

	errsBefore := len(theirs.stats().errs)
	ourProxy.Freeze()
	theirProxy.Freeze()
	waitFor(t, "listener to notice the silent connection", func() bool { return !ours.Stats().Connected })
	drain(sub)
	ourProxy.Restore()
	ring(t, sub, "listener's reconnect")

	// Fifty health checks on the new connection take at least five seconds:
	// more than the probe's keepalives need (three seconds) if anything
	// answered them as a dead peer would, by not answering.
	pings := ours.Stats().Pings
	waitFor(t, "fifty more health checks", func() bool { return ours.Stats().Pings >= pings+50 })
	notify(t, pool, listener.ChannelPending, "q")
	ring(t, sub, "a notification after the reconnect")

	s := theirs.stats()
	if s.listens != 1 || len(s.errs) != errsBefore || len(s.payloads) != 0 {
		t.Fatalf("pgxlisten noticed the half-open connection (sessions %d, errors %v, payloads %q): "+
			"consider building listener on it", s.listens, s.errs[errsBefore:], s.payloads)
	}
}

// A standby refuses LISTEN, and a restart drops the connection: pgxlisten
// retries both and listens again, as listener does, given a ReconnectDelay
// (its default of a minute would leave workers deaf that long after each
// restart). What it lacks here is polish, not recovery: one fixed delay in
// place of backoff with jitter, and one logged error per attempt, where
// listener logs one warning per outage that names the standby.
func TestPgxlistenRecoversFromStandbyAndRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private PostgreSQL primary and standby")
	}
	t.Parallel()
	ctx := context.Background()
	primary, err := pgtest.StartCluster(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { primary.Destroy() })
	standby, err := pgtest.StartStandby(ctx, primary)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Destroy() })
	url := standby.URL("postgres")

	var logs syncBuffer
	ours := newListener(t, &listener.Config{
		URL:          url,
		Logger:       slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		BackoffMin:   10 * time.Millisecond,
		BackoffMax:   100 * time.Millisecond,
		PingInterval: time.Hour, // the restart is the only drop
		// Connect and LISTEN time out only on a machine this slow, so that the
		// first failure is the standby's refusal.
		PingTimeout: time.Minute,
	})
	sub := ours.Subscribe("q")
	defer sub.Close()
	run(t, ours)
	theirs := &probe{urls: []string{url}}
	startProbe(t, theirs, 50*time.Millisecond)

	waitFor(t, "three refused attempts each", func() bool {
		refused := 0
		for _, err := range theirs.stats().errs {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "25006" {
				refused++
			}
		}
		return ours.Stats().Failures >= 3 && refused >= 3
	})
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	ring(t, sub, "listener on the promoted standby")
	waitFor(t, "pgxlisten on the promoted standby", func() bool { return theirs.stats().listens >= 1 })
	out := logs.String()
	if strings.Count(out, "level=WARN") != 1 || !strings.Contains(out, "standby") {
		t.Fatalf("listener logged, for one outage on a standby:\n%s", out)
	}

	if err := standby.Restart(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	ring(t, sub, "listener after the restart")
	waitFor(t, "pgxlisten after the restart", func() bool { return theirs.stats().listens >= 2 })
	notify(t, pgtest.PoolFor(t, url), listener.ChannelPending, "q")
	ring(t, sub, "listener: a notification after the restart")
	waitFor(t, "pgxlisten: a notification after the restart", func() bool {
		return slices.Contains(theirs.stats().payloads, "q")
	})
}
