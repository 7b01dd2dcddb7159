package check

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
)

var (
	scrapeOnce  sync.Once
	scrapeNames map[string]bool
	scrapeErr   error
)

// exportedNames returns the names of the series that a running `pgworker
// run --metrics-addr` exports once it has completed, failed and cancelled
// rows (a counter with labels appears at its first event). Every test
// shares one process.
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	scrapeOnce.Do(func() {
		// Stays when scrapeRunningWorker stops the test that called it first.
		scrapeErr = errors.New("the scrape of pgworker run failed in an earlier test")
		scrapeNames, scrapeErr = scrapeRunningWorker(t)
	})
	if scrapeErr != nil {
		t.Fatal(scrapeErr)
	}
	return scrapeNames
}

// worker is a running pgworker run and the log lines it wrote.
type worker struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs []map[string]any
	text strings.Builder
	done chan struct{}
}

func (w *worker) find(msg string) map[string]any {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range w.logs {
		if l["msg"] == msg {
			return l
		}
	}
	return nil
}

// waitFor polls cond until it holds, the worker exits or a minute passes.
func (w *worker) waitFor(what string, cond func() bool) error {
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		select {
		case <-w.done:
			return fmt.Errorf("pgworker run exited while waiting for %s:\n%s", what, w.log())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %s within a minute:\n%s", what, w.log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

func (w *worker) log() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.text.String()
}

func scrapeRunningWorker(t *testing.T) (map[string]bool, error) {
	// The database and directories outlive this test's subtests: they are
	// cleaned up with the test that asked first.
	url := newDB(t)
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	for _, d := range []string{in, out} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	for _, name := range []string{"ok.txt", "bad.txt", "hang.txt"} {
		if err := os.WriteFile(filepath.Join(in, name), []byte(name), 0o644); err != nil {
			return nil, err
		}
	}
	backend := filepath.Join(dir, "backend.sh")
	script := "#!/bin/sh\ncase \"${1##*/}\" in\n*bad*) echo refused >&2; exit 3;;\n*hang*) exec sleep 600;;\nesac\ncp \"$1\" \"$2/\"\n"
	if err := os.WriteFile(backend, []byte(script), 0o755); err != nil {
		return nil, err
	}

	cmd := exec.Command(pgworkerBin, "run", "--exec", backend+" {input} {output_dir}", "--slots", "3",
		"--heartbeat", "200ms", "--lease-timeout", "2s", "--input-store", "file://"+in, "--output-store", "file://"+out,
		"--work-dir", filepath.Join(dir, "work"), "--metrics-addr", "127.0.0.1:0", "--log-format", "json")
	cmd.Env = append(os.Environ(), "PGWORKER_DATABASE_URL="+url)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	w := &worker{cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var l map[string]any
			_ = json.Unmarshal(sc.Bytes(), &l)
			w.mu.Lock()
			w.text.WriteString(sc.Text() + "\n")
			if l != nil {
				w.logs = append(w.logs, l)
			}
			w.mu.Unlock()
		}
		_ = cmd.Wait()
		close(w.done)
	}()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-w.done:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			<-w.done
		}
	}()

	var base string
	if err := w.waitFor("metrics server", func() bool {
		if l := w.find("serving metrics"); l != nil {
			base = "http://" + fmt.Sprint(l["addr"])
			return true
		}
		return false
	}); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	count := func(sql string) int {
		var n int
		if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
			return -1
		}
		return n
	}
	if _, err := conn.Exec(ctx, "INSERT INTO files.files (source, max_attempts) VALUES ('ok.txt', 1), ('bad.txt', 1), ('hang.txt', 1)"); err != nil {
		return nil, err
	}
	if err := w.waitFor("ok.txt done, bad.txt failed and hang.txt running", func() bool {
		return count(`SELECT count(*) FROM files.files WHERE (source, state) IN (('ok.txt', 'done'), ('bad.txt', 'failed'), ('hang.txt', 'running'))`) == 3
	}); err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "SELECT files.cancel(id) FROM files.files WHERE source = 'hang.txt'"); err != nil {
		return nil, err
	}

	var names map[string]bool
	scrapeErr := w.waitFor("a scrape with every row's events", func() bool {
		names, err = scrape(base + "/metrics")
		return err == nil && names["pgworker_rows_cancelled_total"] && names["pgworker_rows_failed_total"] &&
			names["pgworker_rows_done_total"] && names["pgworker_scaling_mean_attempt_seconds"]
	})
	if scrapeErr != nil {
		return nil, fmt.Errorf("%w (last scrape error: %v)", scrapeErr, err)
	}
	return names, nil
}

// scrape returns the names of the series of a Prometheus text scrape, a
// histogram's _bucket, _sum and _count included.
func scrape(url string) (map[string]bool, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("%s: %s\n%s", url, resp.Status, b)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for name, f := range families {
		if len(f.GetMetric()) == 0 {
			continue
		}
		switch f.GetType().String() {
		case "HISTOGRAM":
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[name+s] = true
			}
		case "SUMMARY":
			names[name+"_sum"], names[name+"_count"], names[name] = true, true, true
		default:
			names[name] = true
		}
	}
	return names, nil
}

// metricNames returns the metric names an expression selects.
func metricNames(expr parser.Expr) []string {
	var out []string
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == model.MetricNameLabel {
					name = m.Value
				}
			}
			out = append(out, name)
		}
		return nil
	})
	return out
}

// checkNames reports each name not in exported.
func checkNames(t *testing.T, where string, names []string, exported map[string]bool) {
	t.Helper()
	if len(names) == 0 {
		t.Errorf("%s selects no metric", where)
	}
	for _, n := range names {
		if !exported[n] {
			t.Errorf("%s: pgworker exports no %s", where, n)
		}
	}
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestScrapeSeesEveryKind keeps the reference list honest: the scrape has
// the metrics of each kind the checks below rely on.
func TestScrapeSeesEveryKind(t *testing.T) {
	names := exportedNames(t)
	for _, n := range []string{"pgworker_slots_busy", "pgworker_queue_running_rows", "pgworker_backend_duration_seconds_bucket",
		`pgworker_rows_failed_total`, "pgworker_listener_up", "go_goroutines"} {
		if !names[n] {
			t.Errorf("the scrape lacks %s; it has %v", n, sortedKeys(names))
		}
	}
	if names["pgworker_no_such_metric"] || names["pgworker_backend_duration_seconds"] {
		t.Error("the scrape holds names it should not")
	}
}

// alertTopics names, for each condition that must page or warn, the metrics
// that some alerting rule has to select.
var alertTopics = map[string][]string{
	"silent workers holding rows": {"pgworker_queue_running_rows", "pgworker_slots_busy", "pgworker_outcomes_unrecorded"},
	"a queue's failure rate":      {"pgworker_rows_failed_total", "pgworker_rows_done_total"},
	"a growing backlog":           {"pgworker_queue_pending_rows"},
	"a listener down":             {"pgworker_listener_up"},
	"claim errors":                {"pgworker_claim_errors_total"},
	"heartbeat errors":            {"pgworker_heartbeat_errors_total"},
	"slots waiting for commits":   {"pgworker_outcome_waits_total"},
	"the oldest pending row":      {"pgworker_queue_oldest_pending_age_seconds"},
}

func TestAlertRules(t *testing.T) {
	exported := exportedNames(t)
	p := parser.NewParser(parser.Options{})
	groups, errs := rulefmtParse(t, p)
	for _, err := range errs {
		t.Error(err)
	}
	if groups == nil {
		t.FailNow()
	}
	used := map[string]bool{}
	seen := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			where := fmt.Sprintf("%s: alert %s", alertsFile, r.Alert)
			if r.Alert == "" {
				t.Errorf("%s: group %s has a rule that is not an alert (%q)", alertsFile, g.Name, r.Record)
				continue
			}
			if seen[r.Alert] {
				t.Errorf("%s twice", where)
			}
			seen[r.Alert] = true
			expr, err := p.ParseExpr(r.Expr)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			names := metricNames(expr)
			checkNames(t, where, names, exported)
			for _, n := range names {
				used[n] = true
			}
			if s := r.Labels["severity"]; s != "page" && s != "ticket" {
				t.Errorf("%s: severity %q, want page or ticket", where, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s lacks a summary or description", where)
			}
			if r.Labels["severity"] == "page" && time.Duration(r.For) < 2*time.Minute {
				t.Errorf("%s pages on a blip: for %v", where, r.For)
			}
		}
	}
	for topic, names := range alertTopics {
		for _, n := range names {
			if !used[n] {
				t.Errorf("no alert on %s uses %s", topic, n)
			}
		}
	}
}

// dashboard is the part of Grafana's dashboard model that pgworker.json
// uses; unknown fields fail the decoding.
type dashboard struct {
	Title         string                    `json:"title"`
	UID           string                    `json:"uid"`
	Description   string                    `json:"description"`
	Tags          []string                  `json:"tags"`
	Editable      bool                      `json:"editable"`
	GraphTooltip  int                       `json:"graphTooltip"`
	SchemaVersion int                       `json:"schemaVersion"`
	Version       int                       `json:"version"`
	Refresh       string                    `json:"refresh"`
	Time          struct{ From, To string } `json:"time"`
	Timezone      string                    `json:"timezone"`
	Annotations   struct {
		List []json.RawMessage `json:"list"`
	} `json:"annotations"`
	Templating struct {
		List []templateVar `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type templateVar struct {
	Name       string         `json:"name"`
	Label      string         `json:"label"`
	Type       string         `json:"type"`
	Datasource *datasourceRef `json:"datasource,omitempty"`
	Query      any            `json:"query"`
	Definition string         `json:"definition,omitempty"`
	Refresh    int            `json:"refresh,omitempty"`
	IncludeAll bool           `json:"includeAll,omitempty"`
	Multi      bool           `json:"multi,omitempty"`
	AllValue   string         `json:"allValue,omitempty"`
	Sort       int            `json:"sort,omitempty"`
	Hide       int            `json:"hide"`
	Current    *struct {
		Text  string `json:"text"`
		Value string `json:"value"`
	} `json:"current,omitempty"`
}

type panel struct {
	ID          int            `json:"id"`
	Type        string         `json:"type"`
	Title       string         `json:"title"`
	Description string         `json:"description,omitempty"`
	Collapsed   bool           `json:"collapsed,omitempty"`
	Datasource  *datasourceRef `json:"datasource,omitempty"`
	GridPos     struct {
		H, W, X, Y int
	} `json:"gridPos"`
	FieldConfig *struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
		Overrides []json.RawMessage `json:"overrides"`
	} `json:"fieldConfig,omitempty"`
	Targets []struct {
		RefID        string         `json:"refId"`
		Datasource   *datasourceRef `json:"datasource"`
		Expr         string         `json:"expr"`
		LegendFormat string         `json:"legendFormat"`
	} `json:"targets,omitempty"`
	Panels []panel `json:"panels,omitempty"`
}

// grafanaVars replaces the dashboard's variables with what Grafana would
// put in their place, so that an expression parses as PromQL.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$queue", ".*")

func TestGrafanaDashboard(t *testing.T) {
	exported := exportedNames(t)
	dec := json.NewDecoder(strings.NewReader(read(t, dashboardFile)))
	dec.DisallowUnknownFields()
	var d dashboard
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("the dashboard has no uid or title")
	}
	p := parser.NewParser(parser.Options{})
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)
		text, _ := q["query"].(string)
		metric, ok := strings.CutPrefix(text, "label_values(")
		metric, _, _ = strings.Cut(metric, ",")
		if !ok || !exported[strings.TrimSpace(metric)] {
			t.Errorf("variable %s: query %q does not take label_values of an exported metric", v.Name, text)
		}
	}
	if !vars["datasource"] || !vars["queue"] {
		t.Errorf("variables %v: want datasource and queue", vars)
	}
	ids := map[int]bool{}
	exprs := 0
	for _, pn := range d.Panels {
		if ids[pn.ID] {
			t.Errorf("panel id %d twice", pn.ID)
		}
		ids[pn.ID] = true
		if pn.GridPos.X+pn.GridPos.W > 24 || pn.GridPos.W <= 0 || pn.GridPos.H <= 0 {
			t.Errorf("panel %q: gridPos %+v outside the 24 columns", pn.Title, pn.GridPos)
		}
		if pn.Type == "row" {
			continue
		}
		if pn.Datasource == nil || pn.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q does not use the datasource variable", pn.Title)
		}
		if len(pn.Targets) == 0 {
			t.Errorf("panel %q has no query", pn.Title)
		}
		for _, tg := range pn.Targets {
			where := fmt.Sprintf("%s: panel %q, query %s", dashboardFile, pn.Title, tg.RefID)
			text := grafanaVars.Replace(tg.Expr)
			if strings.Contains(text, "$") {
				t.Errorf("%s uses a variable the dashboard does not define: %s", where, tg.Expr)
				continue
			}
			expr, err := p.ParseExpr(text)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			checkNames(t, where, metricNames(expr), exported)
			exprs++
		}
	}
	if exprs < 10 {
		t.Errorf("only %d queries", exprs)
	}
	// The check itself: a misspelt metric is caught.
	expr, _ := p.ParseExpr(`rate(pgworker_rows_don_total[5m])`)
	if slices.ContainsFunc(metricNames(expr), func(n string) bool { return exported[n] }) {
		t.Error("the name check accepts pgworker_rows_don_total")
	}
}
