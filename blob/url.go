package blob

import (
	"errors"
	"fmt"
	"net/url"
	"path"
	"path/filepath"
	"strings"
)

// Location is a parsed store URL: s3://bucket/prefix or file:///dir.
type Location struct {
	// Scheme is "s3" or "file".
	Scheme string
	// Bucket is the S3 bucket (s3 only).
	Bucket string
	// Prefix is prepended to every key in the bucket (s3 only): empty, or a
	// valid key prefix ending in "/".
	Prefix string
	// Dir is the store's root directory (file only): absolute and clean.
	Dir string
}

// String returns the URL of the location, which ParseURL reads back.
func (l Location) String() string {
	switch l.Scheme {
	case "s3":
		u := url.URL{Scheme: "s3", Host: l.Bucket}
		if l.Prefix != "" {
			u.Path = "/" + l.Prefix
		}
		return u.String()
	case "file":
		return (&url.URL{Scheme: "file", Path: filepath.ToSlash(l.Dir)}).String()
	}
	return "invalid:"
}

// ParseURL parses a store URL: "s3://bucket", "s3://bucket/prefix" (the
// prefix is read as a directory: "s3://b/in" holds key "x" as object "in/x"),
// or "file:///absolute/dir". Every error wraps ErrInvalidURL and says what to
// write instead. Credentials in the URL are refused and never echoed.
func ParseURL(raw string) (Location, error) {
	u, err := parseStoreURL(raw)
	if err != nil {
		return Location{}, err
	}
	switch u.Scheme {
	case "s3":
		prefix := strings.TrimPrefix(u.Path, "/")
		if prefix != "" {
			if err := validatePrefix(prefix); err != nil {
				return Location{}, fmt.Errorf("%w: s3://%s: %w", ErrInvalidURL, u.Host, err)
			}
			if !strings.HasSuffix(prefix, "/") {
				prefix += "/"
			}
		}
		return Location{Scheme: "s3", Bucket: u.Host, Prefix: prefix}, nil
	default: // file
		return Location{Scheme: "file", Dir: filepath.Clean(filepath.FromSlash(u.Path))}, nil
	}
}

// SplitURL parses the URL of one object, "s3://bucket/dir/key" or
// "file:///dir/key", into the location of a store holding it and its key in
// that store: (s3://bucket, "dir/key") or (file:///dir, "key").
func SplitURL(raw string) (Location, string, error) {
	u, err := parseStoreURL(raw)
	if err != nil {
		return Location{}, "", err
	}
	switch u.Scheme {
	case "s3":
		key := strings.TrimPrefix(u.Path, "/")
		if key == "" {
			return Location{}, "", fmt.Errorf("%w: s3://%s names a bucket, not an object", ErrInvalidURL, u.Host)
		}
		if err := ValidateKey(key); err != nil {
			return Location{}, "", fmt.Errorf("%w: s3://%s: %w", ErrInvalidURL, u.Host, err)
		}
		return Location{Scheme: "s3", Bucket: u.Host}, key, nil
	default: // file
		p := u.Path
		if strings.HasSuffix(p, "/") {
			return Location{}, "", fmt.Errorf("%w: %s names a directory, not a file", ErrInvalidURL, raw)
		}
		dir, key := path.Split(p)
		if err := ValidateKey(key); err != nil {
			return Location{}, "", fmt.Errorf("%w: %w", ErrInvalidURL, err)
		}
		return Location{Scheme: "file", Dir: filepath.Clean(filepath.FromSlash(dir))}, key, nil
	}
}

// Contains reports whether the object key in store o also lies in l, and
// under which key. o and key are what SplitURL returns.
func (l Location) Contains(o Location, key string) (string, bool) {
	if l.Scheme != o.Scheme {
		return "", false
	}
	switch l.Scheme {
	case "s3":
		full := o.Prefix + key
		if l.Bucket != o.Bucket || !strings.HasPrefix(full, l.Prefix) {
			return "", false
		}
		rel := strings.TrimPrefix(full, l.Prefix)
		return rel, rel != "" && ValidateKey(rel) == nil
	case "file":
		rel, err := filepath.Rel(l.Dir, filepath.Join(o.Dir, filepath.FromSlash(key)))
		if err != nil || !filepath.IsLocal(rel) {
			return "", false
		}
		rel = filepath.ToSlash(rel)
		return rel, ValidateKey(rel) == nil
	}
	return "", false
}

// parseStoreURL does the checks that store and object URLs share.
func parseStoreURL(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, fmt.Errorf("%w: empty (use s3://bucket/prefix or file:///dir)", ErrInvalidURL)
	}
	if strings.HasPrefix(raw, "/") {
		return nil, fmt.Errorf("%w: %q is a path: write file://%s", ErrInvalidURL, raw, raw)
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url.Error repeats the whole URL, which may hold a secret: keep only the reason.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("%w: cannot parse: %v", ErrInvalidURL, err)
	}
	if u.User != nil {
		return nil, fmt.Errorf("%w: credentials in the URL are not accepted "+
			"(set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY instead)", ErrInvalidURL)
	}
	switch u.Scheme {
	case "s3", "file":
	case "":
		return nil, fmt.Errorf("%w: %q has no scheme (use s3://bucket/prefix or file:///dir)", ErrInvalidURL, raw)
	default:
		return nil, fmt.Errorf("%w: unknown scheme %q (use s3://bucket/prefix or file:///dir)", ErrInvalidURL, u.Scheme)
	}
	if u.Opaque != "" {
		if u.Scheme == "file" {
			return nil, fmt.Errorf("%w: %q is a relative file path (use file:///absolute/dir)", ErrInvalidURL, raw)
		}
		return nil, fmt.Errorf("%w: %q: write s3://bucket/prefix", ErrInvalidURL, raw)
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return nil, fmt.Errorf("%w: %s://%s: query or fragment (\"?\", \"#\") not allowed", ErrInvalidURL, u.Scheme, u.Host)
	}
	if u.Scheme == "s3" {
		if u.Port() != "" {
			return nil, fmt.Errorf("%w: s3://%s: a bucket has no port (set the endpoint in PGWORKER_S3_ENDPOINT)", ErrInvalidURL, u.Host)
		}
		if err := checkBucket(u.Host); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidURL, err)
		}
		return u, nil
	}
	if u.Host != "" && u.Host != "localhost" {
		return nil, fmt.Errorf("%w: file URL with host %q (use file:///absolute/dir; a relative path is not accepted)", ErrInvalidURL, u.Host)
	}
	if u.Path == "" || u.Path[0] != '/' {
		return nil, fmt.Errorf("%w: missing directory (use file:///absolute/dir)", ErrInvalidURL)
	}
	for _, r := range u.Path {
		if r < 0x20 || r == 0x7f {
			return nil, fmt.Errorf("%w: control character in file path", ErrInvalidURL)
		}
	}
	return u, nil
}

// checkBucket applies S3's bucket naming rules, so that a typo is reported
// here rather than as a puzzling answer from the server.
func checkBucket(b string) error {
	switch {
	case b == "":
		return errors.New("missing bucket (use s3://bucket/prefix)")
	case len(b) < 3 || len(b) > 63:
		return fmt.Errorf("bucket %q: must be 3 to 63 characters", b)
	case strings.Contains(b, ".."):
		return fmt.Errorf("bucket %q: \"..\" not allowed", b)
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if alnum || (c == '-' || c == '.') && i > 0 && i < len(b)-1 {
			continue
		}
		if c >= 'A' && c <= 'Z' {
			return fmt.Errorf("bucket %q: upper-case letters not allowed", b)
		}
		return fmt.Errorf("bucket %q: only a-z, 0-9, '.' and '-' allowed, starting and ending with a letter or digit", b)
	}
	return nil
}
