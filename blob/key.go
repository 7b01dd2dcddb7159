package blob

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"
)

// MaxKeyLen is the longest key accepted, in bytes: S3's limit.
const MaxKeyLen = 1024

// maxSegmentLen is the longest path segment: a file name on Linux.
const maxSegmentLen = 255

// tempPrefix starts the names of the files written before they are renamed
// into place. Listings skip them and keys may not use them.
const tempPrefix = ".pgworker-tmp-"

// ValidateKey returns nil when key is a safe object key: a relative,
// slash-separated path of at most MaxKeyLen bytes of UTF-8 whose segments are
// non-empty, not "." or "..", at most 255 bytes, without control characters
// (NUL included) or backslashes, and not named like pgworker's temporary files.
// Such a key stays below the directory it is joined to on any platform.
// Otherwise the error wraps ErrInvalidKey and says what is wrong.
func ValidateKey(key string) error {
	if reason := checkPath(key, false); reason != "" {
		return fmt.Errorf("%w %s: %s", ErrInvalidKey, quoteKey(key), reason)
	}
	return nil
}

// validatePrefix is ValidateKey for a listing prefix, which may be empty, end
// with a slash, or end in the middle of a segment.
func validatePrefix(prefix string) error {
	if reason := checkPath(prefix, true); reason != "" {
		return fmt.Errorf("%w: prefix %s: %s", ErrInvalidKey, quoteKey(prefix), reason)
	}
	return nil
}

func checkPath(s string, prefix bool) string {
	switch {
	case s == "" && prefix:
		return ""
	case s == "":
		return "empty key"
	case len(s) > MaxKeyLen:
		return fmt.Sprintf("longer than %d bytes", MaxKeyLen)
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	case s[0] == '/':
		return "absolute path (a key is relative to the store)"
	}
	for _, r := range s {
		switch {
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0):
			return "control character"
		case r == '\\':
			return `backslash (keys use "/" only)`
		}
	}
	segs := strings.Split(s, "/")
	for i, seg := range segs {
		last := i == len(segs)-1
		switch {
		case seg == "" && last && prefix:
			// "dir/" lists below dir.
		case seg == "" && last:
			return `ends with "/" (a key names an object, not a directory)`
		case seg == "":
			return `empty path segment ("//")`
		case seg == "." || seg == "..":
			return fmt.Sprintf("%q path segment", seg)
		case len(seg) > maxSegmentLen:
			return fmt.Sprintf("path segment longer than %d bytes", maxSegmentLen)
		case strings.HasPrefix(seg, tempPrefix):
			return fmt.Sprintf("segment starts with %q, reserved for temporary files", tempPrefix)
		}
	}
	return ""
}

// LocalPath returns the path of key below the local directory dir, for
// placing a downloaded object. It refuses (with an error wrapping
// ErrInvalidKey) a key that ValidateKey refuses and a path that would pass
// through a symbolic link below dir, so neither a hostile key nor a link left
// in dir leads a write outside dir. Missing directories on the way are fine:
// GetFile creates them. dir itself may be or contain links; nothing in it
// should change while the path is used.
func LocalPath(dir, key string) (string, error) {
	if err := ValidateKey(key); err != nil {
		return "", err
	}
	if dir == "" {
		return "", errors.New("local path: empty directory")
	}
	p := filepath.Join(dir, filepath.FromSlash(key))
	rel, err := filepath.Rel(dir, p)
	if err != nil || !filepath.IsLocal(rel) {
		// Unreachable for a valid key; kept as a second lock.
		return "", fmt.Errorf("%w %s: leaves %s", ErrInvalidKey, quoteKey(key), dir)
	}
	if err := noLinks(dir, rel); err != nil {
		return "", err
	}
	return p, nil
}

// LocalKey is the inverse of LocalPath: the key of the file at path, which
// must lie below dir, for uploading the files a program wrote into dir. It
// refuses paths outside dir, names that are not valid keys, and paths that
// pass through or end in a symbolic link, so a program cannot make pgworker
// upload a file from elsewhere by linking to it.
func LocalKey(dir, path string) (string, error) {
	rel, err := filepath.Rel(dir, path)
	if err != nil || !filepath.IsLocal(rel) {
		return "", fmt.Errorf("%w: %q is not below %s", ErrInvalidKey, path, dir)
	}
	key := filepath.ToSlash(rel)
	if err := ValidateKey(key); err != nil {
		return "", err
	}
	if err := noLinks(dir, rel); err != nil {
		return "", err
	}
	return key, nil
}

// noLinks fails when a path element of rel below dir is a symbolic link.
func noLinks(dir, rel string) error {
	cur := dir
	for seg := range strings.SplitSeq(rel, string(filepath.Separator)) {
		cur = filepath.Join(cur, seg)
		fi, err := os.Lstat(cur)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("check %s: %w", cur, err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%w: %s is a symbolic link", ErrInvalidKey, cur)
		}
	}
	return nil
}
