package dashboard

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgworker/pgworker/queue"
)

const (
	csrfCookie = "pgworker_csrf"
	csrfField  = "csrf"
	// maxActionIDs bounds the rows of one action.
	maxActionIDs = 10_000
	realm        = `Basic realm="pgworker dashboard", charset="UTF-8"`
	// bearerRealm answers a refused action: browsers show the page (which
	// says to sign in) rather than prompt and replay the form.
	bearerRealm = `Bearer realm="pgworker dashboard"`
)

// csrfCookie returns the request's CSRF token, setting a new one in a
// SameSite=Strict cookie when it has none: forms carry it in a field, and
// an action is taken only when field and cookie agree.
func (d *Dashboard) csrfCookie(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && validToken(c.Value) {
		return c.Value
	}
	b := make([]byte, 32)
	rand.Read(b)
	tok := base64.RawURLEncoding.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: tok, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	return tok
}

func validToken(s string) bool {
	b, err := base64.RawURLEncoding.DecodeString(s)
	return err == nil && len(b) == 32
}

// user authenticates r: the token as a bearer header, or as the password of
// basic auth, whose user name is then who acts. ok is false otherwise.
func (d *Dashboard) user(r *http.Request) (who string, ok bool) {
	want := []byte(d.cfg.Token)
	if h := r.Header.Get("Authorization"); strings.HasPrefix(h, "Bearer ") {
		got := []byte(strings.TrimPrefix(h, "Bearer "))
		return "bearer token", subtle.ConstantTimeCompare(got, want) == 1
	}
	name, pass, hasBasic := r.BasicAuth()
	if !hasBasic {
		return "", false
	}
	if name == "" {
		name = "basic auth"
	}
	return name, subtle.ConstantTimeCompare([]byte(pass), want) == 1
}

// sameOrigin refuses requests that a browser sent from another site.
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return false
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true // not a browser's cross-site form: those send Origin
	}
	u, err := url.Parse(origin)
	return err == nil && u.Host == r.Host
}

// login asks a browser for the token by basic auth, so that it sends it
// with the actions afterwards, and goes back.
func (d *Dashboard) login(w http.ResponseWriter, r *http.Request) {
	if !d.cfg.AllowActions {
		d.message(w, http.StatusNotFound, "Actions are off", "This dashboard is read-only: start it with --allow-actions and PGWORKER_DASHBOARD_TOKEN to retry, cancel, pause and resume.", "/")
		return
	}
	if _, ok := d.user(r); !ok {
		w.Header().Set("WWW-Authenticate", realm)
		d.message(w, http.StatusUnauthorized, "Sign in", "Give any user name and the dashboard's token as the password.", "/")
		return
	}
	http.Redirect(w, r, returnPath(r.URL.Query().Get("return")), http.StatusSeeOther)
}

// action runs a POSTed retry, cancel, pause or resume after the checks:
// actions on, authenticated, same origin, CSRF token.
func (d *Dashboard) action(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("action")
	if !d.cfg.AllowActions {
		d.message(w, http.StatusForbidden, "Actions are off", "This dashboard is read-only: start it with --allow-actions and PGWORKER_DASHBOARD_TOKEN to act.", "/")
		return
	}
	who, ok := d.user(r)
	if !ok {
		d.logger.Warn("dashboard: action refused: not authenticated", "action", name, "remote", r.RemoteAddr)
		w.Header().Set("WWW-Authenticate", bearerRealm)
		d.message(w, http.StatusUnauthorized, "Not signed in", "Actions need the dashboard's token: sign in at /login, or send it as a bearer header.", "/login")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	if err := r.ParseForm(); err != nil {
		d.message(w, http.StatusBadRequest, "Bad request", "The form could not be read.", "/")
		return
	}
	c, err := r.Cookie(csrfCookie)
	if !sameOrigin(r) || err != nil || !validToken(c.Value) ||
		subtle.ConstantTimeCompare([]byte(c.Value), []byte(r.PostForm.Get(csrfField))) != 1 {
		d.logger.Warn("dashboard: action refused: cross-site or without its CSRF token", "action", name, "user", who,
			"remote", r.RemoteAddr)
		d.message(w, http.StatusForbidden, "Refused", "The request did not come from a page of this dashboard (missing or wrong CSRF token, or another origin). Reload the page and try again.", "/")
		return
	}
	back := returnPath(r.PostForm.Get("return"))
	text, err := d.act(r.Context(), name, r.PostForm)
	var bad *badAction
	switch {
	case errors.As(err, &bad):
		d.message(w, http.StatusBadRequest, "Bad request", bad.msg, back)
		return
	case err != nil:
		d.logger.Error("dashboard: action failed", "action", name, "user", who, "remote", r.RemoteAddr, "error", err)
		d.message(w, http.StatusBadGateway, "The action failed", explain(err), back)
		return
	}
	d.logger.Info("dashboard: action", "action", name, "user", who, "remote", r.RemoteAddr,
		"ids", r.PostForm["id"], "queue", r.PostForm.Get("queue"), "result", text)
	// The pages show what the action did from now on: the snapshot they
	// are rendered from is read after it.
	ctx, cancel := context.WithTimeout(r.Context(), d.cfg.QueryTimeout)
	_, _ = d.hub.since(ctx, time.Now())
	cancel()
	d.message(w, http.StatusOK, "Done", text, back)
}

type badAction struct{ msg string }

func (e *badAction) Error() string { return e.msg }

// act runs one action through package queue and says what it did.
func (d *Dashboard) act(ctx context.Context, name string, form url.Values) (string, error) {
	q := queue.New(d.pool, &queue.Config{Logger: d.logger})
	d.hub.pageQueries.Add(1)
	switch name {
	case "retry", "cancel":
		ids, err := formIDs(form["id"])
		if err != nil {
			return "", err
		}
		if name == "retry" {
			n, err := q.Retry(ctx, ids, nil)
			return fmt.Sprintf("Requeued %d of the %d rows selected (only failed, cancelled or done rows are retried).", n, len(ids)), err
		}
		n, err := q.Cancel(ctx, ids)
		return fmt.Sprintf("Cancelled %d of the %d rows selected (only pending or running rows are cancelled).", n, len(ids)), err
	case "pause", "resume":
		name, qn := name, form.Get("queue")
		if err := queue.CheckQueue(qn); err != nil {
			return "", &badAction{msg: "Give a queue name of 1 to 128 characters."}
		}
		if name == "pause" {
			_, err := q.Pause(ctx, qn)
			return fmt.Sprintf("Paused queue %q: workers take no new rows from it; running rows go on.", qn), err
		}
		if err := q.Resume(ctx, qn); errors.Is(err, queue.ErrNoQueue) {
			return "", &badAction{msg: fmt.Sprintf("There is no queue named %q.", qn)}
		} else if err != nil {
			return "", err
		}
		return fmt.Sprintf("Resumed queue %q.", qn), nil
	}
	return "", &badAction{msg: "Unknown action: use retry, cancel, pause or resume."}
}

func formIDs(vals []string) ([]int64, error) {
	if len(vals) == 0 {
		return nil, &badAction{msg: "Select at least one row."}
	}
	if len(vals) > maxActionIDs {
		return nil, &badAction{msg: fmt.Sprintf("At most %d rows at once.", maxActionIDs)}
	}
	ids := make([]int64, 0, len(vals))
	for _, v := range vals {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id < 1 {
			return nil, &badAction{msg: "A row id is a positive whole number."}
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// explain says what to do about the errors that have an obvious fix.
func explain(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return "The dashboard's database user may not do this: grant it the pgworker_admin role. (" + pgErr.Message + ")"
	}
	return errorText(err)
}
