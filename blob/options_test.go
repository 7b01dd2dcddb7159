package blob

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestOptionsFromEnv(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"PGWORKER_S3_ENDPOINT":     "http://minio:9000",
		"AWS_DEFAULT_REGION":       "eu-west-3",
		"AWS_CA_BUNDLE":            "/etc/ca.pem",
		"PGWORKER_S3_VIRTUAL_HOST": "true",
		"AWS_SECRET_ACCESS_KEY":    "not copied",
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	o, err := optionsFromLookup(lookup)
	if err != nil {
		t.Fatal(err)
	}
	want := Options{Endpoint: "http://minio:9000", Region: "eu-west-3", CAFile: "/etc/ca.pem", VirtualHostStyle: true}
	if fmt.Sprint(o) != fmt.Sprint(want) {
		t.Errorf("options = %+v, want %+v", o, want)
	}
	env["AWS_REGION"] = "us-east-2"
	env["PGWORKER_S3_CA_FILE"] = "/etc/pgworker-ca.pem"
	if o, _ := optionsFromLookup(lookup); o.Region != "us-east-2" || o.CAFile != "/etc/pgworker-ca.pem" {
		t.Errorf("AWS_REGION and PGWORKER_S3_CA_FILE should win: %+v", o)
	}
	env["PGWORKER_S3_VIRTUAL_HOST"] = "maybe"
	if _, err := optionsFromLookup(lookup); err == nil || !strings.Contains(err.Error(), "PGWORKER_S3_VIRTUAL_HOST") {
		t.Errorf("bad bool: err = %v", err)
	}
}

func TestParseEndpoint(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in     string
		host   string
		secure bool
		err    string
	}{
		{"", "s3.amazonaws.com", true, ""},
		{"minio:9000", "minio:9000", true, ""},
		{"https://minio.example.com", "minio.example.com", true, ""},
		{"http://127.0.0.1:9000", "127.0.0.1:9000", false, ""},
		{"http://127.0.0.1:9000/", "127.0.0.1:9000", false, ""},
		{"http://minio:9000/bucket", "", false, "without a path"},
		{"ftp://minio", "", false, "scheme"},
		{"http://AKIA:topsecret@minio:9000", "", false, "credentials"},
		{"AKIA:topsecret@minio:9000", "", false, "want host"},
		{"minio/x", "", false, "want host"},
	} {
		host, secure, err := parseEndpoint(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "topsecret") {
				t.Errorf("parseEndpoint(%q) = %v, want an error saying %q without the secret", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || host != tc.host || secure != tc.secure {
			t.Errorf("parseEndpoint(%q) = %q, %v, %v; want %q, %v", tc.in, host, secure, err, tc.host, tc.secure)
		}
	}
}

func TestRetry(t *testing.T) {
	t.Parallel()
	s := newSettings(&Options{Retry: Retry{Attempts: 4, Backoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}})
	ctx := context.Background()
	transient := errors.New("connection reset")

	calls := 0
	err := s.retry(ctx, "x", func(context.Context) error { calls++; return transient })
	if !errors.Is(err, transient) || calls != 4 {
		t.Errorf("transient: err = %v after %d calls, want 4 calls", err, calls)
	}

	calls = 0
	err = s.retry(ctx, "x", func(context.Context) error { calls++; return classify(ErrNotFound, transient) })
	if !errors.Is(err, ErrNotFound) || calls != 1 {
		t.Errorf("permanent: err = %v after %d calls, want 1 call", err, calls)
	}

	calls = 0
	err = s.retry(ctx, "x", func(context.Context) error {
		calls++
		if calls < 3 {
			return transient
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Errorf("recovering: err = %v after %d calls", err, calls)
	}

	calls = 0
	err = s.retry(ctx, "x", func(context.Context) error { calls++; return stop{transient} })
	if err != transient || calls != 1 {
		t.Errorf("stop: err = %v after %d calls", err, calls)
	}

	// A cancelled context ends the waits.
	slow := newSettings(&Options{Retry: Retry{Attempts: 100, Backoff: time.Hour}})
	cctx, cancel := context.WithCancel(ctx)
	calls = 0
	err = slow.retry(cctx, "x", func(context.Context) error { calls++; cancel(); return transient })
	if !errors.Is(err, context.Canceled) || calls != 1 || IsPermanent(err) {
		t.Errorf("cancelled: err = %v after %d calls", err, calls)
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	s := newSettings(nil)
	if s.PartSize != 16<<20 || s.Retry.Attempts != 6 || s.IdleTimeout != time.Minute || s.log == nil {
		t.Errorf("defaults = %+v", s.Options)
	}
	if s := newSettings(&Options{PartSize: 1}); s.PartSize != minPartSize {
		t.Errorf("PartSize 1 became %d, want S3's minimum %d", s.PartSize, minPartSize)
	}
	st := &s3Store{s: s}
	if got := st.partSize(200 << 30); got*maxParts < 200<<30 || got%(1<<20) != 0 {
		t.Errorf("partSize(200 GiB) = %d: does not fit %d parts", got, maxParts)
	}
}
