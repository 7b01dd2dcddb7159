package dashboard

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"time"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// pageNames are the templates, each parsed with the layout.
var pageNames = []string{"overview", "workers", "failures", "row", "queues", "message"}

var pages = parsePages()

func parsePages() map[string]*template.Template {
	out := map[string]*template.Template{}
	for _, name := range pageNames {
		t := template.New(name).Funcs(funcs)
		out[name] = template.Must(t.ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html"))
	}
	return out
}

// pageData is what every page template gets.
type pageData struct {
	Title   string
	Nav     string // the tab to mark
	Live    string // the page whose fragment the event stream sends; "" for none
	Node    string // the node the Workers page shows alone; "" for every node
	Chart   bool   // load the charting library
	Version string
	Actions bool
	CSRF    string
	Return  string // where an action returns to
	Flash   string
	Banner  *banner
	// ReloadOnRecovery reloads the page when the database answers again:
	// pages whose content is not live.
	ReloadOnRecovery bool
	// LiveHTML is the live part, when rendered already (from the cache of
	// a snapshot); else the page's "live" template renders it.
	LiveHTML template.HTML
	Body     any
}

// banner is the outage notice.
type banner struct {
	Title, Detail string
	Since         string
	DataAt        string
}

func snapshotBanner(s *snapshot) *banner {
	switch {
	case s.err != nil:
		b := &banner{Title: "The database does not answer.", Detail: errorText(s.err), Since: ts(s.errSince)}
		if s.loaded {
			b.DataAt = ts(s.at)
		}
		return b
	case !s.loaded:
		return &banner{Title: "Loading.", Detail: "The first read of the database has not finished yet."}
	}
	return nil
}

// errorText is an error as the banner shows it: one line.
func errorText(err error) string {
	return clip(300, fmt.Sprint(err))
}

// render writes a whole page.
func (d *Dashboard) render(w http.ResponseWriter, status int, name string, p *pageData) {
	p.Version, p.Actions = d.cfg.Version, d.cfg.AllowActions
	var buf bytes.Buffer
	if err := pages[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		d.logger.Error("dashboard: render page", "page", name, "error", err)
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// message renders a page of one message.
func (d *Dashboard) message(w http.ResponseWriter, status int, title, text, back string) {
	d.render(w, status, "message", &pageData{Title: title, Body: struct{ Text, Back string }{text, back}})
}

// event is what an event stream sends per snapshot: the page's live
// fragment, and the chart's data on the Overview.
type event struct {
	Gen   uint64     `json:"gen"`
	OK    bool       `json:"ok"` // the database answered the last refresh
	HTML  string     `json:"html"`
	Chart *chartData `json:"chart,omitempty"`
}

// frag is a page's live part rendered from one snapshot: as HTML for the
// page, and as the event that streams send.
type frag struct {
	html  template.HTML
	event []byte
}

// fragment returns the live part of page for snapshot s, rendered once per
// snapshot and page however many pages and streams show it.
func (d *Dashboard) fragment(s *snapshot, page, node string) (*frag, error) {
	key := page + "\x00" + node
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.frags[key]; ok {
		return f, nil
	}
	p := d.livePage(s, page, node)
	var buf bytes.Buffer
	if err := pages[page].ExecuteTemplate(&buf, "live", p); err != nil {
		return nil, err
	}
	ev := event{Gen: s.gen, OK: s.err == nil && s.loaded, HTML: buf.String()}
	if page == "overview" && s.slowRead {
		ev.Chart = &s.chart
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return nil, err
	}
	if s.frags == nil {
		s.frags = map[string]*frag{}
	}
	//nolint:gosec // rendered by html/template above, which escaped every value
	f := &frag{html: template.HTML(buf.String()), event: b}
	s.frags[key] = f
	return f, nil
}

// withLive sets p's live part from the cache of s.
func (d *Dashboard) withLive(p *pageData, s *snapshot) {
	if f, err := d.fragment(s, p.Live, p.Node); err == nil {
		p.LiveHTML = f.html
	} else {
		d.logger.Error("dashboard: render live part", "page", p.Live, "error", err)
	}
}

// livePage is the data of page's live part, from s alone; node narrows the
// Workers page to one node.
func (d *Dashboard) livePage(s *snapshot, page, node string) *pageData {
	p := &pageData{Live: page, Node: node, Banner: snapshotBanner(s), Version: d.cfg.Version, Actions: d.cfg.AllowActions}
	switch page {
	case "overview":
		p.Body = newOverview(s)
	case "workers":
		p.Body = newWorkersBody(s, node)
	case "failures":
		p.Body = &failuresBody{failureGroups: newFailureGroups(s)}
	}
	return p
}

// staticHandler serves the embedded assets, to be cached for an hour.
func staticHandler() http.Handler {
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic(err)
	}
	files := http.StripPrefix("/static/", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", fmt.Sprintf("public, max-age=%d", int(time.Hour.Seconds())))
		files.ServeHTTP(w, r)
	})
}
