//go:build linux

package faults

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// manifest is the part of pipeline.Manifest that the checks read.
type manifest struct {
	Input struct {
		Key    string `json:"key"`
		SHA256 string `json:"sha256"`
	} `json:"input"`
	OutputRoot string `json:"output_root"`
	Outputs    []struct {
		URL    string `json:"url"`
		Key    string `json:"key"`
		Size   int64  `json:"size"`
		SHA256 string `json:"sha256"`
	} `json:"outputs"`
	Worker  string `json:"worker_id"`
	Attempt int    `json:"attempt"`
}

// tally is what the invariant checks found.
type tally struct {
	rows, done, failed, cancelled, open int
	// twice: rows with more than one done attempt; foreign: results that
	// are not the output of the row's done attempt.
	twice, foreign int
	// missing: done rows whose result objects are missing or differ from
	// their recorded size and checksum (or from the input they copy).
	missing int
	// openAttempts: attempts without an outcome on finished rows.
	openAttempts int
	attempts     map[string]int // by outcome
	workers      map[string]int // slots by state
	// losingOutputs: attempt prefixes with uploaded outputs that are no
	// row's result (attempts that lost their row, or were released).
	losingOutputs int
}

// lost is the number of rows the run lost: not finished, or finished
// without their outputs.
func (t *tally) lost() int { return t.open + t.missing }

// recordedTwice is the number of rows whose outcome was recorded more than
// once, or whose result came from another attempt than the done one.
func (t *tally) recordedTwice() int { return t.twice + t.foreign }

// verify checks the invariants on the scenario's database and bucket. The
// processes should be stopped.
func (r *rig) verify() *tally {
	r.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t := &tally{attempts: map[string]int{}, workers: map[string]int{}}
	var err error

	states := map[string]int{}
	if err = r.groupCount(ctx, states, `SELECT state, count(*) FROM files.files GROUP BY state`); err != nil {
		r.T.Fatal(err)
	}
	t.done, t.failed, t.cancelled = states["done"], states["failed"], states["cancelled"]
	t.open = states["pending"] + states["running"]
	for _, n := range states {
		t.rows += n
	}
	if err = r.groupCount(ctx, t.attempts, `SELECT coalesce(outcome, 'open'), count(*) FROM files.attempts GROUP BY 1`); err != nil {
		r.T.Fatal(err)
	}
	if err = r.groupCount(ctx, t.workers, `SELECT state, count(*) FROM files.workers GROUP BY state`); err != nil {
		r.T.Fatal(err)
	}
	if t.open > 0 {
		r.T.Errorf("invariant: %d rows are not in a terminal state", t.open)
	}
	if t.failed > 0 {
		var errs []string
		_ = r.strings(ctx, &errs, `SELECT id || ': ' || last_error FROM files.files WHERE state = 'failed' ORDER BY id LIMIT 5`)
		r.T.Errorf("%d rows failed; none should in this scenario: %s", t.failed, strings.Join(errs, "; "))
	}

	var twice []string
	if err = r.strings(ctx, &twice, `SELECT file_id::text FROM files.attempts WHERE outcome = 'done'
		GROUP BY file_id HAVING count(*) > 1 ORDER BY file_id`); err != nil {
		r.T.Fatal(err)
	}
	t.twice = len(twice)
	if t.twice > 0 {
		r.T.Errorf("invariant: %d rows have more than one done attempt: %s", t.twice, clip(twice))
	}
	if t.openAttempts, err = r.Count(ctx, `SELECT count(*) FROM files.attempts a JOIN files.files f ON f.id = a.file_id
		WHERE a.outcome IS NULL AND f.state IN ('done', 'failed', 'cancelled')`); err != nil {
		r.T.Fatal(err)
	}
	if t.openAttempts > 0 {
		r.T.Errorf("%d attempts of finished rows have no outcome", t.openAttempts)
	}

	// Each done row: its result is its single done attempt's output.
	type doneRow struct {
		id             int64
		source         string
		result         []byte
		worker         *string
		attempt        *int32
		same           *bool
		doneAttempts   int64
		resultIsObject bool
	}
	rows, err := r.DB.Query(ctx, `
		SELECT f.id, f.source, f.result::text, d.worker_id, d.attempt, d.attempt IS NOT NULL AND d.output IS NULL,
		       (SELECT count(*) FROM files.attempts a WHERE a.file_id = f.id AND a.outcome = 'done'),
		       jsonb_typeof(f.result) = 'object'
		FROM files.files f
		LEFT JOIN LATERAL (SELECT a.worker_id, a.attempt, a.output FROM files.attempts a
		                   WHERE a.file_id = f.id AND a.outcome = 'done' ORDER BY a.id LIMIT 1) d ON true
		WHERE f.state = 'done' ORDER BY f.id`)
	if err != nil {
		r.T.Fatal(err)
	}
	var done []doneRow
	for rows.Next() {
		var d doneRow
		var result *string
		var isObject *bool
		if err := rows.Scan(&d.id, &d.source, &result, &d.worker, &d.attempt, &d.same, &d.doneAttempts, &isObject); err != nil {
			r.T.Fatal(err)
		}
		if result != nil {
			d.result = []byte(*result)
		}
		d.resultIsObject = isObject != nil && *isObject
		done = append(done, d)
	}
	if err := rows.Err(); err != nil {
		r.T.Fatal(err)
	}

	type object struct {
		row       int64
		url, sha  string
		size      int64
		inputSHA  string
		inputSize int64
	}
	var objects []object
	referenced := map[string]bool{}
	var foreign []string
	for _, d := range done {
		bad := func(format string, args ...any) {
			t.foreign++
			foreign = append(foreign, fmt.Sprintf("row %d: ", d.id)+fmt.Sprintf(format, args...))
		}
		if d.doneAttempts != 1 || d.worker == nil || d.attempt == nil {
			bad("%d done attempts", d.doneAttempts)
			continue
		}
		if !d.resultIsObject {
			bad("result is not a manifest: %s", d.result)
			continue
		}
		var m manifest
		if err := json.Unmarshal(d.result, &m); err != nil {
			bad("result: %v", err)
			continue
		}
		root := regexp.MustCompile(fmt.Sprintf(`^s3://%s/out/%d/%d-[0-9a-f]{8}$`, regexp.QuoteMeta(r.bucket), d.id, *d.attempt))
		in, known := r.inputs[d.source]
		switch {
		case d.same == nil || !*d.same:
			bad("no done attempt, or it stores a second copy of the result")
		case m.Worker != *d.worker || m.Attempt != int(*d.attempt):
			bad("result of %s attempt %d, but the done attempt is %s attempt %d", m.Worker, m.Attempt, *d.worker, *d.attempt)
		case !root.MatchString(m.OutputRoot):
			bad("output root %s is not the done attempt's (attempt %d)", m.OutputRoot, *d.attempt)
		case len(m.Outputs) != 1:
			bad("%d outputs, want the one the backend writes", len(m.Outputs))
		case !known || m.Input.SHA256 != in.sha:
			bad("input checksum %s, want %s", m.Input.SHA256, in.sha)
		default:
			o := m.Outputs[0]
			prefix := strings.TrimPrefix(m.OutputRoot, "s3://"+r.bucket+"/out/")
			if o.URL != m.OutputRoot+"/"+d.source || o.Key != prefix+"/"+d.source {
				bad("output %s is not under the result's output root %s", o.URL, m.OutputRoot)
				continue
			}
			referenced[prefix] = true
			objects = append(objects, object{row: d.id, url: o.URL, sha: o.SHA256, size: o.Size, inputSHA: in.sha, inputSize: in.size})
		}
	}
	if t.foreign > 0 {
		r.T.Errorf("invariant: %d results are not their done attempt's output: %s", t.foreign, clip(foreign))
	}

	// Every result's object exists with its recorded checksum.
	var (
		mu      sync.Mutex
		missing []string
		wg      sync.WaitGroup
		next    = make(chan object)
	)
	for range 8 {
		wg.Go(func() {
			for o := range next {
				b, err := r.Get(ctx, o.url)
				sum := sha256.Sum256(b)
				got := hex.EncodeToString(sum[:])
				var problem string
				switch {
				case err != nil:
					problem = err.Error()
				case got != o.sha || int64(len(b)) != o.size:
					problem = fmt.Sprintf("holds %d bytes with SHA-256 %s, recorded %d bytes %s", len(b), got, o.size, o.sha)
				case got != o.inputSHA || int64(len(b)) != o.inputSize:
					problem = "differs from its input"
				}
				if problem != "" {
					mu.Lock()
					missing = append(missing, fmt.Sprintf("row %d: %s: %s", o.row, o.url, problem))
					mu.Unlock()
				}
			}
		})
	}
	for _, o := range objects {
		next <- o
	}
	close(next)
	wg.Wait()
	t.missing = len(missing)
	if t.missing > 0 {
		slices.Sort(missing)
		r.T.Errorf("invariant: %d results' objects are missing or corrupt: %s", t.missing, clip(missing))
	}

	prefixes, err := r.outputPrefixes(ctx)
	if err != nil {
		r.T.Fatal(err)
	}
	for p := range prefixes {
		if !referenced[p] {
			t.losingOutputs++
		}
	}
	var span, mean time.Duration
	_ = r.DB.QueryRow(ctx, `SELECT coalesce(max(finished_at) - min(started_at), '0'), coalesce(avg(duration), '0')
		FROM files.attempts`).Scan(&span, &mean)
	r.T.Logf("rows %d: done %d, failed %d, open %d; attempts %v; slots %v; outputs of losing attempts %d; run %s, mean attempt %s",
		t.rows, t.done, t.failed, t.open, t.attempts, t.workers, t.losingOutputs, span, mean)
	return t
}

func (r *rig) groupCount(ctx context.Context, into map[string]int, sql string) error {
	rows, err := r.DB.Query(ctx, sql)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var n int64
		if err := rows.Scan(&k, &n); err != nil {
			return err
		}
		into[k] = int(n)
	}
	return rows.Err()
}

func (r *rig) strings(ctx context.Context, into *[]string, sql string, args ...any) error {
	rows, err := r.DB.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return err
		}
		*into = append(*into, s)
	}
	return rows.Err()
}

func clip(s []string) string {
	if len(s) > 5 {
		return strings.Join(s[:5], "; ") + fmt.Sprintf("; ... (%d more)", len(s)-5)
	}
	return strings.Join(s, "; ")
}

// result is a scenario's line in FAULTS.md.
type result struct {
	num     int
	name    string
	rows    int
	done    int
	faults  string
	lost    int
	twice   int
	longest time.Duration
	notes   []string
	failed  bool
}

var report struct {
	mu      sync.Mutex
	form    string
	results []*result
}

// record checks the invariants and adds the scenario's line to the report.
func (r *rig) record(num int, name, faults string, notes ...string) *tally {
	r.T.Helper()
	longest := r.longest()
	t := r.verify()
	res := &result{
		num: num, name: name, rows: t.rows, done: t.done, faults: faults,
		lost: t.lost(), twice: t.recordedTwice(), longest: longest,
	}
	res.notes = append(res.notes, fmt.Sprintf("attempts: %s", outcomes(t.attempts)))
	if t.losingOutputs > 0 {
		res.notes = append(res.notes, fmt.Sprintf("%d output prefixes of losing attempts, none a result", t.losingOutputs))
	}
	res.notes = append(res.notes, notes...)
	report.mu.Lock()
	report.results = append(report.results, res)
	report.mu.Unlock()
	r.T.Cleanup(func() { res.failed = r.T.Failed() })
	return t
}

func outcomes(m map[string]int) string {
	var parts []string
	for _, k := range []string{"done", "failed", "lost", "released", "cancelled", "open"} {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", m[k], k))
		}
	}
	return strings.Join(parts, ", ")
}

// writeReport writes FAULTS.md.
func writeReport(file string) error {
	report.mu.Lock()
	defer report.mu.Unlock()
	if len(report.results) == 0 {
		return nil
	}
	slices.SortFunc(report.results, func(a, b *result) int { return a.num - b.num })
	form := "short"
	if full() {
		form = "full"
	}
	var b strings.Builder
	b.WriteString("# Faults survived\n\n")
	b.WriteString("Written by the fault suite (package `faults`, `make test-faults`); do not edit by hand.\n")
	fmt.Fprintf(&b, "Form: %s. ", form)
	b.WriteString("Each scenario runs real `pgworker run` processes, built with `-race`, against a real\n")
	b.WriteString("PostgreSQL and MinIO; the backend sleeps 20-500 ms and copies its input, so that faults land\n")
	b.WriteString("mid-work. Workers heartbeat every 1s with a 5s lease timeout.\n\n")
	b.WriteString("| # | scenario | rows processed | faults injected | rows lost | outcomes recorded twice | longest fault → recovery | notes |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range report.results {
		name := r.name
		if r.failed {
			name += " (**FAILED**)"
		}
		fmt.Fprintf(&b, "| %d | %s | %d of %d | %s | %d | %d | %s | %s |\n",
			r.num, name, r.done, r.rows, r.faults, r.lost, r.twice, r.longest.Round(100*time.Millisecond), strings.Join(r.notes, "; "))
	}
	b.WriteString(reportLegend)
	return os.WriteFile(file, []byte(b.String()), 0o644)
}

const reportLegend = `
**Rows processed**: rows done, of rows enqueued. **Rows lost**: rows not in a terminal state at the
end, plus done rows whose result objects are missing or differ from their recorded size and
SHA-256 (every result object is downloaded from MinIO and hashed). **Outcomes recorded twice**: rows
with more than one done attempt, plus rows whose result is not the output of their single done
attempt (its worker id, attempt number and per-attempt output prefix). **Longest fault → recovery**:
from the injection of a fault to the moment its scenario's recovery condition held (below); for
outages (MinIO, the work directory) it includes the outage.

Recovery conditions:

1. kill -9: every row the killed process held is done by another worker.
2. PostgreSQL restart: a row completed after the restart, every live slot heartbeated after it,
   and every process listens again.
3. Partition: every row the cut-off worker held is done elsewhere (cut), and after the heal the
   worker heartbeats and completes rows again.
4. PgBouncer restart: a row completed after the restart and every slot heartbeated after it.
5. Failover: on the promoted standby, a row completed, every slot heartbeated and every process
   listens.
6. MinIO outage: a row completed after MinIO came back.
7. Work directory: after the repair, a row completed by the slot that met the fault.
`
