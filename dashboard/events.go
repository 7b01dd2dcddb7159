package dashboard

import (
	"fmt"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"
)

// livePages are the pages an event stream serves.
var livePages = map[string]bool{"overview": true, "workers": true, "failures": true, "queues": true, "row": true}

// keepAlive is how often an idle stream sends a comment, so that proxies
// keep it open and a vanished browser is noticed.
const keepAlive = 15 * time.Second

// events is the server-sent event stream of one page: one "snapshot"
// event per refresh, holding the page's live fragment. It reads nothing
// from the database itself: the hub's loop does, for every stream at once.
func (d *Dashboard) events(w http.ResponseWriter, r *http.Request) {
	page, node := r.URL.Query().Get("page"), r.URL.Query().Get("node")
	if !livePages[page] || len(node) > maxNodeName {
		http.Error(w, "page= names a live page: overview, workers, failures, queues or row", http.StatusBadRequest)
		return
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming is not supported here", http.StatusInternalServerError)
		return
	}
	st := d.hub.open()
	if st == nil {
		http.Error(w, "the dashboard is stopping, or has as many event streams open as it serves", http.StatusServiceUnavailable)
		return
	}
	defer d.hub.closeStream(st)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, "retry: 2000\n\n")

	s := d.snap(r)
	sent := uint64(0)
	send := func(s *snapshot) bool {
		if s.gen == sent && sent != 0 {
			return true
		}
		f, err := d.fragment(s, page, node)
		if err != nil {
			d.logger.Error("dashboard: render event", "page", page, "error", err)
			return false
		}
		sent = s.gen
		if _, err := fmt.Fprintf(w, "event: snapshot\nid: %d\ndata: %s\n\n", s.gen, f.event); err != nil {
			return false
		}
		fl.Flush()
		return true
	}
	if !send(s) {
		return
	}
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for {
		select {
		case s := <-st.ch:
			if !send(s) {
				return
			}
		case <-tick.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
			fl.Flush()
		case <-st.closed:
			return
		case <-r.Context().Done():
			return
		}
	}
}

// download streams one output of a row from the output store: the row's
// result names it by URL, which must lie inside Config.OutputStore.
func (d *Dashboard) download(w http.ResponseWriter, r *http.Request) {
	id, err1 := strconv.ParseInt(r.PathValue("id"), 10, 64)
	n, err2 := strconv.Atoi(r.PathValue("n"))
	if err1 != nil || err2 != nil || id < 1 || n < 0 {
		d.message(w, http.StatusBadRequest, "Bad request", "/rows/ID/outputs/N takes a row id and an output's index.", "/")
		return
	}
	if d.cfg.OutputStore == nil {
		d.message(w, http.StatusNotFound, "Downloads are off", errNoStore.Error(), "/rows/"+r.PathValue("id"))
		return
	}
	ctx := r.Context()
	var result []byte
	d.hub.pageQueries.Add(1)
	if err := d.pool.QueryRow(ctx, sqlResult, id).Scan(&result); err != nil || result == nil {
		d.message(w, http.StatusNotFound, "No such output", "The row does not exist or has no result.", "/rows/"+r.PathValue("id"))
		return
	}
	m := d.outputs(id, result)
	if m == nil || n >= len(m.Outputs) {
		d.message(w, http.StatusNotFound, "No such output", "The row's result lists no such output.", "/rows/"+r.PathValue("id"))
		return
	}
	o := m.Outputs[n]
	key, err := d.storeKey(o.URL)
	if err != nil {
		d.message(w, http.StatusForbidden, "Not served", err.Error(), "/rows/"+r.PathValue("id"))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": fileName(key)}))
	h.Set("Cache-Control", "no-store")
	if o.SHA256 != "" {
		h.Set("X-Content-SHA256", o.SHA256)
	}
	cw := &countingWriter{w: w}
	if _, err := d.cfg.OutputStore.Get(ctx, key, cw); err != nil {
		d.logger.Warn("dashboard: download failed", "row", id, "key", key, "error", err)
		if cw.n == 0 {
			h.Del("Content-Disposition")
			d.message(w, http.StatusBadGateway, "Download failed", errorText(err), "/rows/"+r.PathValue("id"))
			return
		}
		panic(http.ErrAbortHandler) // part was sent: cut the connection so the browser sees a failed download
	}
}

// fileName is the last element of key, for Content-Disposition.
func fileName(key string) string {
	name := path.Base(key)
	if name == "." || name == "/" || strings.ContainsAny(name, "\"\\") {
		return "output"
	}
	return name
}

type countingWriter struct {
	w http.ResponseWriter
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
