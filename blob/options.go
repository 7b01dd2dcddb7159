package blob

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Options configure the stores that Open returns. The zero value works: an
// s3:// store then talks TLS to Amazon S3 with credentials from the chain
// described at Credentials, and every other field takes the default its
// comment states.
type Options struct {
	// Endpoint is the S3 endpoint: "host[:port]" or "https://host[:port]" for
	// TLS, "http://host[:port]" for plain HTTP. Defaults to s3.amazonaws.com.
	Endpoint string
	// AccessKeyID and SecretAccessKey (and SessionToken for temporary
	// credentials), when set, are the only credentials used.
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string
	// Credentials, when set, overrides the keys above. By default the keys
	// above are used, else the first that answers of: AWS_ACCESS_KEY_ID and
	// AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), MINIO_ROOT_USER and
	// MINIO_ROOT_PASSWORD, ~/.aws/credentials, the mc client's config, and an
	// IAM role (web identity, ECS or EC2 instance metadata).
	Credentials *credentials.Credentials
	// Region is the S3 region. Defaults to asking the server where the bucket
	// is (MinIO answers us-east-1).
	Region string
	// VirtualHostStyle addresses buckets as bucket.endpoint. Defaults to false:
	// path-style (endpoint/bucket), which MinIO and most S3-compatible
	// services need.
	VirtualHostStyle bool
	// CAFile is a PEM bundle of certificate authorities trusted for the
	// endpoint, in addition to the system's. Defaults to none.
	CAFile string
	// PartSize is the size of one part of a multipart upload, and so the
	// memory that one upload from a stream holds. Objects up to this size go in
	// one request. Raised when needed to fit S3's 10,000 parts. Defaults to
	// 16 MiB; at least 5 MiB.
	PartSize int64
	// Retry bounds the retries of each request after a transient failure.
	Retry Retry
	// IdleTimeout abandons a transfer (and retries it) when no byte has moved
	// for this long, so that a hung connection does not hang a worker.
	// Defaults to 1 minute.
	IdleTimeout time.Duration
	// Logger receives retries (at debug level) and skipped listing entries (at
	// warn level). Defaults to discarding.
	Logger *slog.Logger
}

// Retry bounds the retries of one request: the download of a range, the
// upload of a part, a stat. Waits grow exponentially with jitter, and a
// cancelled context ends them at once.
type Retry struct {
	// Attempts is how many times a request is tried before its error is
	// returned. Defaults to 6; 1 turns retries off.
	Attempts int
	// Backoff is the wait after the first failure, doubled after each further
	// one. Defaults to 200ms.
	Backoff time.Duration
	// MaxBackoff caps one wait. Defaults to 5s.
	MaxBackoff time.Duration
}

const (
	defaultPartSize    = 16 << 20
	minPartSize        = 5 << 20
	maxParts           = 10000
	defaultIdleTimeout = time.Minute
)

// OptionsFromEnv returns Options read from the environment:
//
//	PGWORKER_S3_ENDPOINT      Endpoint (http:// turns TLS off)
//	AWS_REGION                Region (else AWS_DEFAULT_REGION)
//	PGWORKER_S3_CA_FILE       CAFile (else AWS_CA_BUNDLE)
//	PGWORKER_S3_VIRTUAL_HOST  VirtualHostStyle ("true" or "false")
//
// Credentials are left to the chain described at Options.Credentials, which
// reads AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY itself, so that the
// secret is never copied into a struct that might be printed.
func OptionsFromEnv() (Options, error) {
	return optionsFromLookup(os.LookupEnv)
}

func optionsFromLookup(lookup func(string) (string, bool)) (Options, error) {
	get := func(names ...string) string {
		for _, n := range names {
			if v, ok := lookup(n); ok && v != "" {
				return v
			}
		}
		return ""
	}
	o := Options{
		Endpoint: get("PGWORKER_S3_ENDPOINT"),
		Region:   get("AWS_REGION", "AWS_DEFAULT_REGION"),
		CAFile:   get("PGWORKER_S3_CA_FILE", "AWS_CA_BUNDLE"),
	}
	if v := get("PGWORKER_S3_VIRTUAL_HOST"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return Options{}, fmt.Errorf("PGWORKER_S3_VIRTUAL_HOST=%q: want true or false", v)
		}
		o.VirtualHostStyle = b
	}
	return o, nil
}

// settings are Options with the defaults filled in.
type settings struct {
	Options
	log *slog.Logger
}

func newSettings(o *Options) *settings {
	s := &settings{}
	if o != nil {
		s.Options = *o
	}
	if s.PartSize <= 0 {
		s.PartSize = defaultPartSize
	}
	s.PartSize = max(s.PartSize, minPartSize)
	if s.Retry.Attempts <= 0 {
		s.Retry.Attempts = 6
	}
	if s.Retry.Backoff <= 0 {
		s.Retry.Backoff = 200 * time.Millisecond
	}
	if s.Retry.MaxBackoff <= 0 {
		s.Retry.MaxBackoff = 5 * time.Second
	}
	if s.IdleTimeout <= 0 {
		s.IdleTimeout = defaultIdleTimeout
	}
	s.log = s.Logger
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s
}

// stop marks an error that must not be retried although it is not permanent
// for the caller, such as a failed write to the caller's writer.
type stop struct{ err error }

func (s stop) Error() string { return s.err.Error() }
func (s stop) Unwrap() error { return s.err }

// retry runs fn until it succeeds, fails permanently, or has been tried
// Retry.Attempts times, waiting with exponential backoff and full jitter in
// between. what describes the request for the debug log.
func (s *settings) retry(ctx context.Context, what string, fn func(ctx context.Context) error) error {
	wait := s.Retry.Backoff
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		var st stop
		if errors.As(err, &st) {
			return st.err
		}
		if IsPermanent(err) || attempt >= s.Retry.Attempts {
			return err
		}
		if ctx.Err() != nil {
			if errors.Is(err, ctx.Err()) {
				return err
			}
			return fmt.Errorf("%w (interrupted: %w)", err, context.Cause(ctx))
		}
		// Full jitter, but never less than half the wait, so that attempts
		// still spread over the intended time.
		d := wait/2 + rand.N(wait/2+1)
		s.log.DebugContext(ctx, "blob: retrying", "request", what, "attempt", attempt, "wait", d, "err", err)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (after %d attempts, last error: %v)", context.Cause(ctx), attempt, err)
		case <-t.C:
		}
		wait = min(2*wait, s.Retry.MaxBackoff)
	}
}
