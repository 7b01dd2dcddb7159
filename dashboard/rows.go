package dashboard

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgworker/pgworker/blob"
)

var errNoRow = errors.New("no such row")

// rowView is one row of files.files, long texts cut.
type rowView struct {
	ID                    int64
	Queue                 string
	Priority              int32
	Source                string
	SourceBytes           int64
	State                 string
	WorkerID              *string
	Attempt, MaxAttempts  int32
	RunAfter              time.Time
	LeaseExpiresAt        *time.Time
	CreatedAt             time.Time
	ClaimedAt, FinishedAt *time.Time
	LastError             string
	Payload               string
	PayloadBytes          int64
	Result                string
	ResultBytes           int64
	ResultCut             bool
	Batch                 *string
}

// attemptView is one ended attempt.
type attemptView struct {
	FileID     int64
	Attempt    int32
	WorkerID   string
	StartedAt  time.Time
	FinishedAt *time.Time
	Outcome    *string
	Error      *string
	ExitCode   *int32
	Duration   *time.Duration
	Stderr     *string
}

// manifest is what `pgworker run` records as a row's result.
type manifest struct {
	Outputs []outputView `json:"outputs"`
	More    int          `json:"-"`
}

type outputView struct {
	URL    string `json:"url"`
	Key    string `json:"key"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	Href   string `json:"-"` // the dashboard's download link; "" when not served
	Why    string `json:"-"` // why not
}

type rowBody struct {
	Row      *rowView
	Attempts []attemptView
	Manifest *manifest
}

func (d *Dashboard) readRow(ctx context.Context, id int64) (*rowBody, error) {
	var (
		v          rowView
		lastErr    *string
		result     *string
		resultSize *int64
	)
	d.hub.pageQueries.Add(1)
	err := d.pool.QueryRow(ctx, sqlRow, id, maxSourceChars, maxErrorChars, maxPayloadChars, maxResultChars).Scan(
		&v.ID, &v.Queue, &v.Priority, &v.Source, &v.SourceBytes, &v.State, &v.WorkerID, &v.Attempt, &v.MaxAttempts,
		&v.RunAfter, &v.LeaseExpiresAt, &v.CreatedAt, &v.ClaimedAt, &v.FinishedAt, &lastErr, &v.Payload,
		&v.PayloadBytes, &result, &resultSize, &v.Batch)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, errNoRow
	}
	if err != nil {
		return nil, err
	}
	v.LastError = deref(lastErr)
	v.Payload = indentJSON(v.Payload, v.PayloadBytes <= maxPayloadChars)
	body := &rowBody{Row: &v}
	if result != nil {
		v.ResultBytes = deref(resultSize)
		v.ResultCut = int64(len(*result)) < v.ResultBytes
		v.Result = indentJSON(*result, !v.ResultCut)
		if !v.ResultCut {
			body.Manifest = d.outputs(id, []byte(*result))
		}
	}
	atts, err := d.readAttempts(ctx, d.pool, []int64{id}, maxAttempts)
	if err != nil {
		return nil, err
	}
	body.Attempts = atts
	return body, nil
}

// indentJSON pretty-prints whole JSON; a cut one is shown as it is.
func indentJSON(s string, whole bool) string {
	if !whole {
		return s
	}
	var b bytes.Buffer
	if err := json.Indent(&b, []byte(s), "", "  "); err != nil {
		return s
	}
	return b.String()
}

// outputs reads the outputs of a manifest, with a download link for each
// one inside the output store. nil when the result is no manifest.
func (d *Dashboard) outputs(id int64, result []byte) *manifest {
	var m manifest
	if err := json.Unmarshal(result, &m); err != nil || m.Outputs == nil {
		return nil
	}
	if len(m.Outputs) > maxOutputs {
		m.More = len(m.Outputs) - maxOutputs
		m.Outputs = m.Outputs[:maxOutputs]
	}
	for i := range m.Outputs {
		o := &m.Outputs[i]
		if _, err := d.storeKey(o.URL); err != nil {
			o.Why = err.Error()
			continue
		}
		o.Href = "/rows/" + strconv.FormatInt(id, 10) + "/outputs/" + strconv.Itoa(i)
	}
	return &m
}

var (
	errNoStore      = errors.New("downloads are off: start the dashboard with --output-store")
	errOutsideStore = errors.New("the object is not inside the dashboard's output store")
)

// storeKey returns the key in the output store of the object at rawURL.
func (d *Dashboard) storeKey(rawURL string) (string, error) {
	if d.cfg.OutputStore == nil {
		return "", errNoStore
	}
	loc, key, err := blob.SplitURL(rawURL)
	if err != nil {
		return "", errOutsideStore
	}
	rel, ok := d.cfg.OutputStore.Location().Contains(loc, key)
	if !ok {
		return "", errOutsideStore
	}
	return rel, nil
}

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func (d *Dashboard) readAttempts(ctx context.Context, db querier, ids []int64, limit int) ([]attemptView, error) {
	d.hub.pageQueries.Add(1)
	rows, err := db.Query(ctx, sqlAttempts, ids, limit, maxErrorChars, maxStderrChars)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (attemptView, error) {
		var (
			a   attemptView
			dur pgtype.Interval
		)
		err := row.Scan(&a.FileID, &a.Attempt, &a.WorkerID, &a.StartedAt, &a.FinishedAt, &a.Outcome, &a.Error,
			&a.ExitCode, &dur, &a.Stderr)
		a.Duration = duration(dur)
		return a, err
	})
}

// groupRows is one page of the failed rows of a failure group.
type groupRows struct {
	Key    string
	Before *int64
	Rows   []failedRow
	Next   *int64 // the id to page on from, when there are more
}

type failedRow struct {
	ID                   int64
	Queue, Source        string
	Attempt, MaxAttempts int32
	FinishedAt           *time.Time
	Error                string
	Stderr               *string
	Attempts             []attemptView
}

// readGroup reads a page of a failure group in a read-only transaction
// without parallel workers: the page walks the primary key backwards to
// its first 51 matches, which one process does sooner than starting more.
func (d *Dashboard) readGroup(ctx context.Context, key string, before *int64) (*groupRows, error) {
	var g *groupRows
	err := pgx.BeginTxFunc(ctx, d.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		d.hub.pageQueries.Add(1)
		if _, err := tx.Exec(ctx, sqlNoParallel); err != nil {
			return err
		}
		var err error
		g, err = d.readGroupIn(ctx, tx, key, before)
		return err
	})
	return g, err
}

func (d *Dashboard) readGroupIn(ctx context.Context, tx pgx.Tx, key string, before *int64) (*groupRows, error) {
	g := &groupRows{Key: key, Before: before}
	d.hub.pageQueries.Add(1)
	rows, err := tx.Query(ctx, sqlFailureRows, groupKeyChars, before, failurePage+1, maxSourceChars, maxErrorChars, key)
	if err != nil {
		return nil, err
	}
	g.Rows, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (failedRow, error) {
		var (
			f   failedRow
			msg *string
		)
		err := row.Scan(&f.ID, &f.Queue, &f.Source, &f.Attempt, &f.MaxAttempts, &f.FinishedAt, &msg)
		f.Error = deref(msg)
		return f, err
	})
	if err != nil {
		return nil, err
	}
	if len(g.Rows) > failurePage {
		g.Rows = g.Rows[:failurePage]
		g.Next = &g.Rows[failurePage-1].ID
	}
	if len(g.Rows) == 0 {
		return g, nil
	}
	ids := make([]int64, len(g.Rows))
	for i, f := range g.Rows {
		ids[i] = f.ID
	}
	atts, err := d.readAttempts(ctx, tx, ids, failurePage*20)
	if err != nil {
		return nil, err
	}
	byID := map[int64]int{}
	for i, f := range g.Rows {
		byID[f.ID] = i
	}
	for _, a := range atts {
		f := &g.Rows[byID[a.FileID]]
		if f.Stderr == nil && a.Stderr != nil && *a.Stderr != "" {
			f.Stderr = a.Stderr // of the newest attempt that has one
		}
		f.Attempts = append(f.Attempts, a)
	}
	return g, nil
}
