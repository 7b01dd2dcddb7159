package blob

import (
	"context"
	"errors"
	"fmt"
)

// Sentinel errors for the conditions callers branch on. Errors from a Store
// wrap them (test with errors.Is) inside an *Error that names the store and key.
var (
	// ErrNotFound: the object, or the bucket or directory of the store, does not exist.
	ErrNotFound = errors.New("not found")
	// ErrPermission: the store refused the credentials or the access.
	ErrPermission = errors.New("permission denied")
	// ErrInvalidKey: the key is not a safe relative object key, or it would
	// lead outside the store root or a local directory.
	ErrInvalidKey = errors.New("invalid key")
	// ErrIntegrity: the bytes moved do not match the object's size or SHA-256.
	ErrIntegrity = errors.New("integrity check failed")
	// ErrInvalidURL: a store URL that ParseURL refuses.
	ErrInvalidURL = errors.New("invalid store URL")
	// ErrChanged: the object was replaced while it was being read. Transient:
	// reading it again gets the new version.
	ErrChanged = errors.New("object changed while it was read")
)

// IsPermanent reports whether err will not go away by trying the same
// operation again: a missing object, refused credentials, an unsafe key, a
// checksum mismatch or a bad store URL. Anything else (timeouts, 5xx answers,
// refused or reset connections, a full disk) is transient. Context
// cancellation is not permanent either: the work was interrupted, not refused.
func IsPermanent(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	for _, p := range []error{ErrNotFound, ErrPermission, ErrInvalidKey, ErrIntegrity, ErrInvalidURL} {
		if errors.Is(err, p) {
			return true
		}
	}
	return false
}

// Error is the error a Store returns. Its message names the operation, the
// store and the key, never a credential.
type Error struct {
	Op    string // "get", "put", "stat", "list" or "delete"
	Store string // the store's URL, as Location.String prints it
	Key   string // the key relative to the store (the prefix, for "list")
	Err   error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %s key %s: %v", e.Op, e.Store, quoteKey(e.Key), e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// classified ties a backend's error to one of the sentinels while keeping the
// original (a *minio.ErrorResponse, a *fs.PathError) reachable with errors.As.
type classified struct {
	kind error
	err  error
}

func (c *classified) Error() string   { return c.kind.Error() + ": " + c.err.Error() }
func (c *classified) Unwrap() []error { return []error{c.kind, c.err} }

func classify(kind, err error) error { return &classified{kind: kind, err: err} }

// quoteKey quotes a key for a message, shortened so that a hostile kilobyte
// of key does not flood the log.
func quoteKey(key string) string {
	const max = 200
	if len(key) > max {
		return fmt.Sprintf("%q...(%d bytes)", key[:max], len(key))
	}
	return fmt.Sprintf("%q", key)
}
