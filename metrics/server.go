package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func newMux(m *Metrics) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:          slog.NewLogLogger(m.logger.Handler(), slog.LevelWarn),
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: true,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		ok, problems := m.ready(r.Context())
		if more := m.runReadyChecks(r.Context()); len(more) > 0 {
			ok, problems = false, append(problems, more...)
		}
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready")
			fmt.Fprintln(w, strings.Join(problems, "\n"))
			return
		}
		fmt.Fprintln(w, "ready: the database answers and the listener is listening")
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "pgworker: /metrics (Prometheus), /healthz (alive), /readyz (database and listener up)")
	})
	return mux
}

// AddReadyCheck adds a check to /readyz: while check returns an error, the
// process is not ready and /readyz shows the error's text, which should be
// a few words ("work directory out of space") with the details left to
// the log, since anyone who reaches the port reads it.
func (m *Metrics) AddReadyCheck(check func(ctx context.Context) error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.checks = append(m.checks, check)
}

// runReadyChecks returns the errors of the checks added by AddReadyCheck.
func (m *Metrics) runReadyChecks(ctx context.Context) []string {
	m.mu.Lock()
	checks := m.checks
	m.mu.Unlock()
	var problems []string
	for _, check := range checks {
		if err := check(ctx); err != nil {
			problems = append(problems, err.Error())
		}
	}
	return problems
}

// ServerConfig configures a Server.
type ServerConfig struct {
	// Addr is the host:port to listen on; port 0 picks a free port (see
	// Server.Addr). Defaults to "127.0.0.1:9090".
	Addr string

	// Logger receives the server's errors. Defaults to discarding.
	Logger *slog.Logger
}

// Server serves a Handler over HTTP until Stop.
type Server struct {
	addr   string
	h      http.Handler
	logger *slog.Logger

	mu    sync.Mutex
	srv   *http.Server
	ln    net.Listener
	done  chan struct{}
	start bool
}

// NewServer returns a server of h; it listens when Start runs.
func NewServer(h http.Handler, cfg *ServerConfig) *Server {
	if cfg == nil {
		cfg = &ServerConfig{}
	}
	s := &Server{addr: cfg.Addr, h: h, logger: cfg.Logger}
	if s.addr == "" {
		s.addr = "127.0.0.1:9090"
	}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	return s
}

// Start listens on the address and serves in the background. It returns an
// error at once when the address cannot be had (in use, bad host).
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.start {
		return errors.New("metrics: server already started")
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", s.addr)
	if err != nil {
		return fmt.Errorf("metrics: listen on %s: %w", s.addr, err)
	}
	s.start, s.ln, s.done = true, ln, make(chan struct{})
	s.srv = &http.Server{
		Handler:           s.h,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.logger.Handler(), slog.LevelDebug),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.logger.Error("metrics: server stopped", "error", err)
		}
	}()
	return nil
}

// Addr returns the address the server listens on, once started.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return s.addr
	}
	return s.ln.Addr().String()
}

// Stop stops accepting connections and waits for the requests in progress,
// until ctx ends; then it closes what is left.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	srv, done := s.srv, s.done
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	err := srv.Shutdown(ctx)
	if err != nil {
		err = errors.Join(err, srv.Close())
	}
	<-done
	return err
}
