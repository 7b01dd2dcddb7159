package blob

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"iter"
	"os"
	"path/filepath"
	"time"
)

// Store is an object store: a bucket and prefix in S3, or a directory.
// Keys are relative slash-separated paths (see ValidateKey); a key that is not
// valid is refused before any I/O. A Store is safe for concurrent use.
type Store interface {
	// Get writes the object to w, checking its size and, where the store
	// knows it, its SHA-256. Transient failures are retried from where the
	// transfer stopped. On error, w may have received part of the object.
	Get(ctx context.Context, key string, w io.Writer) (Info, error)
	// GetFile downloads the object into the file at path, creating missing
	// parent directories. The file appears at path complete or not at all.
	GetFile(ctx context.Context, key, path string) (Info, error)
	// Put stores the size bytes that r yields (size -1: until EOF). Readers
	// see the old object or the new one, never part of one. Memory use is
	// bounded by Options.PartSize whatever the size.
	Put(ctx context.Context, key string, r io.Reader, size int64) (Info, error)
	// PutFile stores the regular file at path. It does not follow a
	// symbolic link at path, and refuses a file with more than one hard
	// link (ErrInvalidKey), whose other names may be anywhere.
	PutFile(ctx context.Context, key, path string) (Info, error)
	// Stat returns what the store knows about the object without reading it.
	// SHA256 is set only where the store keeps it (s3:// objects that
	// pgworker wrote).
	Stat(ctx context.Context, key string) (Info, error)
	// List yields the objects whose keys start with prefix, in key order,
	// with keys relative to the store. Names that are not valid keys are
	// skipped with a warning in the log. SHA256 is not set. After an error
	// the sequence ends.
	List(ctx context.Context, prefix string) iter.Seq2[Info, error]
	// Delete removes the object. Deleting a missing object is not an error.
	Delete(ctx context.Context, key string) error
	// Location returns where the store is.
	Location() Location
	// Close releases the store's connections and descriptors.
	Close() error
}

// Info describes an object, and what moved in a transfer: the manifest of a
// result records it.
type Info struct {
	Key      string    `json:"key"`
	Size     int64     `json:"size"`
	SHA256   string    `json:"sha256,omitempty"` // lower-case hex
	ETag     string    `json:"etag,omitempty"`
	Modified time.Time `json:"modified,omitzero"`
}

// Open opens the store at a URL that ParseURL accepts. opts may be nil; only
// s3:// stores use it, except for Logger and Retry. Opening an s3:// store
// makes no request: a wrong endpoint or credential shows at the first call.
// A file:// store's directory must exist, so that an NFS share that is not
// mounted is reported rather than quietly replaced by a local directory.
func Open(ctx context.Context, rawURL string, opts *Options) (Store, error) {
	loc, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	return OpenLocation(ctx, loc, opts)
}

// OpenLocation is Open for a parsed URL.
func OpenLocation(ctx context.Context, loc Location, opts *Options) (Store, error) {
	s := newSettings(opts)
	switch loc.Scheme {
	case "s3":
		return newS3Store(loc, s)
	case "file":
		return newFileStore(ctx, loc, s)
	}
	return nil, fmt.Errorf("%w: unknown scheme %q", ErrInvalidURL, loc.Scheme)
}

// getFile implements GetFile on top of Get: it downloads into a temporary
// file next to path, syncs it and renames it into place. Renaming replaces a
// symbolic link at path rather than writing through it.
func getFile(ctx context.Context, s Store, key, path string) (Info, error) {
	fail := func(err error) (Info, error) {
		return Info{}, &Error{Op: "get", Store: s.Location().String(), Key: key, Err: err}
	}
	if err := ValidateKey(key); err != nil {
		return fail(err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail(err)
	}
	f, err := os.CreateTemp(dir, tempPrefix+"*")
	if err != nil {
		return fail(err)
	}
	tmp := f.Name()
	info, err := s.Get(ctx, key, f)
	if err == nil {
		err = f.Chmod(0o644)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		if _, ok := errors.AsType[*Error](err); ok {
			return Info{}, err
		}
		return fail(err)
	}
	return info, nil
}

// copier moves bytes from a source to a destination while hashing them,
// telling read errors (retried) from write errors (not), and cancelling the
// request when no byte has moved for idle.
type copier struct {
	hash hash.Hash
	buf  []byte
	n    int64
	idle time.Duration
}

func newCopier(idle time.Duration) *copier {
	return &copier{hash: sha256.New(), buf: make([]byte, 256<<10), idle: idle}
}

func (c *copier) sum() string { return hex.EncodeToString(c.hash.Sum(nil)) }

var errStalled = errors.New("transfer stalled")

// copy reads src until EOF into dst. t is the idle timer of the request that
// src reads from, which cancels the request when it fires; copy resets it at
// every read.
func (c *copier) copy(dst io.Writer, src io.Reader, t *time.Timer) (readErr, writeErr error) {
	for {
		m, err := src.Read(c.buf)
		if !t.Stop() {
			// The timer fired, so the read failed (or will) because of it;
			// these bytes are read again on the retry.
			return c.stalled(), nil
		}
		t.Reset(c.idle)
		if m > 0 {
			if _, werr := dst.Write(c.buf[:m]); werr != nil {
				return nil, werr
			}
			c.hash.Write(c.buf[:m])
			c.n += int64(m)
		}
		if err == io.EOF {
			return nil, nil
		}
		if err != nil {
			return err, nil
		}
	}
}

func (c *copier) stalled() error {
	return fmt.Errorf("%w: no data for %s", errStalled, c.idle)
}

// watch wraps r so that cancel is called when nobody reads from it for
// idle: the upload it feeds has stopped moving. stop ends the watch.
func watch(r io.Reader, idle time.Duration, cancel context.CancelFunc) (w io.Reader, stop func() bool) {
	t := time.AfterFunc(idle, cancel)
	return &watchedReader{r: r, t: t, idle: idle}, t.Stop
}

type watchedReader struct {
	r    io.Reader
	t    *time.Timer
	idle time.Duration
}

func (w *watchedReader) Read(p []byte) (int, error) {
	n, err := w.r.Read(p)
	w.t.Reset(w.idle)
	return n, err
}
