package dashboard

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// pageFunc fills p for one request and names the template and status.
type pageFunc func(r *http.Request, p *pageData) (name string, status int)

// page wraps a pageFunc: the CSRF cookie, then the template.
func (d *Dashboard) page(fn pageFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p := &pageData{}
		if d.cfg.AllowActions {
			p.CSRF = d.csrfCookie(w, r)
		}
		name, status := fn(r, p)
		d.render(w, status, name, p)
	}
}

// snap returns a fresh snapshot for a page, waiting at most QueryTimeout.
func (d *Dashboard) snap(r *http.Request) *snapshot {
	ctx, cancel := context.WithTimeout(r.Context(), d.cfg.QueryTimeout)
	defer cancel()
	return d.hub.fresh(ctx)
}

// --- Overview ---

type overviewBody struct {
	Queues                                []queueView
	Batches                               []batchView
	Total, Pending, Running, Done, Failed int64
	PerMinute                             float64
	ChartLimit                            int64
}

func newOverview(s *snapshot) *overviewBody {
	o := &overviewBody{Queues: s.queues, Batches: s.batches, ChartLimit: chartAttempts}
	for _, q := range s.queues {
		o.Total += q.Total()
		o.Pending += q.Pending
		o.Running += q.Running
		o.Done += q.Done
		o.Failed += q.Failed
		o.PerMinute += q.PerMinute()
	}
	return o
}

func (d *Dashboard) overview(r *http.Request, p *pageData) (string, int) {
	s := d.snap(r)
	*p = pageData{CSRF: p.CSRF, Title: "Overview", Nav: "overview", Live: "overview", Chart: true,
		Banner: snapshotBanner(s), Body: newOverview(s)}
	d.withLive(p, s)
	return "overview", http.StatusOK
}

// --- Workers ---

type workersBody struct {
	// Summary: too many slots to list them all; each node is summed up,
	// with its slots that need attention, and has a page of its own.
	Summary                         bool
	Node                            string // the one node shown, or ""
	List                            []nodeView
	Nodes, Live, Busy, Silent, Dead int
	Truncated                       int
}

func newWorkersBody(s *snapshot, only string) *workersBody {
	b := &workersBody{List: s.nodes, Node: only}
	if only != "" {
		b.List = nil
		for _, node := range s.nodes {
			if node.Name == only {
				b.List = append(b.List, node)
			}
		}
	}
	n := 0
	for _, node := range b.List {
		if node.Active+node.Draining > 0 {
			b.Nodes++
		}
		b.Live += node.Active + node.Draining
		b.Busy += node.Busy
		b.Silent += node.Silent
		b.Dead += node.Dead
		n += len(node.Slots)
	}
	if n >= maxWorkers {
		b.Truncated = maxWorkers
	}
	if only == "" && n > listedSlots {
		b.Summary = true
		b.List = attention(b.List)
	}
	return b
}

// attention returns the nodes with only their slots that stand out:
// silent, past their lease, dead.
func attention(nodes []nodeView) []nodeView {
	out := make([]nodeView, len(nodes))
	for i, node := range nodes {
		out[i] = node
		out[i].Slots = nil
		for _, sl := range node.Slots {
			if sl.Silent() || sl.Expired() || sl.State == "dead" {
				out[i].Slots = append(out[i].Slots, sl)
			}
		}
	}
	return out
}

func (d *Dashboard) workers(r *http.Request, p *pageData) (string, int) {
	node := r.URL.Query().Get("node")
	if len(node) > maxNodeName {
		return d.badRequest(p, "node= takes a node name.")
	}
	s := d.snap(r)
	*p = pageData{CSRF: p.CSRF, Title: "Workers", Nav: "workers", Live: "workers", Node: node, Banner: snapshotBanner(s),
		Body: newWorkersBody(s, node)}
	d.withLive(p, s)
	return "workers", http.StatusOK
}

// --- Failures ---

type failureGroups struct {
	Groups    []failureGroup
	ReadAt    string
	MaxGroups int
	Newest    int64 // failed rows grouped, at most
	Failed    int64 // failed rows in all
}

func newFailureGroups(s *snapshot) failureGroups {
	g := failureGroups{Groups: s.groups, ReadAt: ts(s.slowAt), MaxGroups: maxGroups, Newest: groupedFailures}
	for _, q := range s.queues {
		g.Failed += q.Failed
	}
	return g
}

type failuresBody struct {
	failureGroups
	Group *groupRows
}

func (d *Dashboard) failures(r *http.Request, p *pageData) (string, int) {
	s := d.snap(r)
	body := &failuresBody{failureGroups: newFailureGroups(s)}
	*p = pageData{CSRF: p.CSRF, Title: "Failures", Nav: "failures", Live: "failures", Banner: snapshotBanner(s),
		Body: body, Return: r.URL.RequestURI()}
	d.withLive(p, s)
	q := r.URL.Query()
	if !q.Has("group") {
		return "failures", http.StatusOK
	}
	var before *int64
	if v := q.Get("before"); v != "" {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id < 1 {
			return d.badRequest(p, "before= takes a row id")
		}
		before = &id
	}
	ctx, cancel := context.WithTimeout(r.Context(), d.cfg.QueryTimeout)
	defer cancel()
	g, err := d.readGroup(ctx, q.Get("group"), before)
	if err != nil {
		p.Banner = &banner{Title: "The rows of this group could not be read.", Detail: errorText(err), Since: ts(time.Now())}
		p.ReloadOnRecovery = true
		return "failures", http.StatusServiceUnavailable
	}
	body.Group = g
	return "failures", http.StatusOK
}

func (d *Dashboard) badRequest(p *pageData, text string) (string, int) {
	*p = pageData{Title: "Bad request", Body: struct{ Text, Back string }{text, "/"}}
	return "message", http.StatusBadRequest
}

// --- Queue controls ---

func (d *Dashboard) queues(r *http.Request, p *pageData) (string, int) {
	s := d.snap(r)
	*p = pageData{CSRF: p.CSRF, Title: "Queues", Nav: "queues", Live: "queues", Banner: snapshotBanner(s),
		Body: newOverview(s)}
	return "queues", http.StatusOK
}

// --- Row ---

// findRow answers the search box: /rows?id=N.
func (d *Dashboard) findRow(r *http.Request, p *pageData) (string, int) {
	v := strings.TrimSpace(r.URL.Query().Get("id"))
	id, err := strconv.ParseInt(v, 10, 64)
	if err != nil || id < 1 {
		return d.badRequest(p, "Give a row id: a positive whole number.")
	}
	return d.rowPage(r, p, id)
}

func (d *Dashboard) row(r *http.Request, p *pageData) (string, int) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		return d.badRequest(p, "A row id is a positive whole number.")
	}
	return d.rowPage(r, p, id)
}

func (d *Dashboard) rowPage(r *http.Request, p *pageData, id int64) (string, int) {
	*p = pageData{CSRF: p.CSRF, Title: "Row " + strconv.FormatInt(id, 10), Live: "row"}
	ctx, cancel := context.WithTimeout(r.Context(), d.cfg.QueryTimeout)
	defer cancel()
	body, err := d.readRow(ctx, id)
	switch {
	case err == errNoRow:
		p.Title = "No such row"
		p.Body = struct{ Text, Back string }{"There is no row " + strconv.FormatInt(id, 10) + " in files.files.", "/"}
		return "message", http.StatusNotFound
	case err != nil:
		p.Banner = &banner{Title: "The row could not be read.", Detail: errorText(err), Since: ts(time.Now())}
		p.ReloadOnRecovery = true
		return "row", http.StatusServiceUnavailable
	}
	p.Body = body
	return "row", http.StatusOK
}

// returnPath is where an action goes back to: a path of this dashboard,
// else the Overview.
func returnPath(v string) string {
	u, err := url.Parse(v)
	if err != nil || u.Scheme != "" || u.Host != "" || !strings.HasPrefix(u.Path, "/") || strings.HasPrefix(v, "//") ||
		strings.ContainsAny(v, "\\\r\n") {
		return "/"
	}
	return u.RequestURI()
}
