package blob_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/pgworker/pgworker/blob"
)

func TestParseURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want blob.Location
		str  string
	}{
		{"s3://bucket", blob.Location{Scheme: "s3", Bucket: "bucket"}, "s3://bucket"},
		{"s3://bucket/", blob.Location{Scheme: "s3", Bucket: "bucket"}, "s3://bucket"},
		{"s3://my.bucket-1/in", blob.Location{Scheme: "s3", Bucket: "my.bucket-1", Prefix: "in/"}, "s3://my.bucket-1/in/"},
		{"s3://b12/a/b/", blob.Location{Scheme: "s3", Bucket: "b12", Prefix: "a/b/"}, "s3://b12/a/b/"},
		{"s3://b12/with%20space", blob.Location{Scheme: "s3", Bucket: "b12", Prefix: "with space/"}, "s3://b12/with%20space/"},
		{"S3://bucket/x", blob.Location{Scheme: "s3", Bucket: "bucket", Prefix: "x/"}, "s3://bucket/x/"},
		{"file:///srv/data", blob.Location{Scheme: "file", Dir: "/srv/data"}, "file:///srv/data"},
		{"file:///srv/data/", blob.Location{Scheme: "file", Dir: "/srv/data"}, "file:///srv/data"},
		{"file://localhost/srv", blob.Location{Scheme: "file", Dir: "/srv"}, "file:///srv"},
		{"file:/srv/x/../y", blob.Location{Scheme: "file", Dir: "/srv/y"}, "file:///srv/y"},
		{"file:///", blob.Location{Scheme: "file", Dir: "/"}, "file:///"},
		{"file:///a%20b", blob.Location{Scheme: "file", Dir: "/a b"}, "file:///a%20b"},
	} {
		got, err := blob.ParseURL(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseURL(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			continue
		}
		if got.String() != tc.str {
			t.Errorf("ParseURL(%q).String() = %q, want %q", tc.in, got.String(), tc.str)
		}
		if again, err := blob.ParseURL(got.String()); err != nil || again != got {
			t.Errorf("ParseURL(%q) = %+v, %v; want %+v", got.String(), again, err, got)
		}
	}
}

func TestParseURLRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, msg string }{
		{"", "empty"},
		{"bucket/prefix", "no scheme"},
		{"/srv/data", "write file:///srv/data"},
		{"http://bucket/x", `unknown scheme "http"`},
		{"gs://bucket", `unknown scheme "gs"`},
		{"s3://", "missing bucket"},
		{"s3:///prefix", "missing bucket"},
		{"s3:bucket", "write s3://bucket/prefix"},
		{"s3://Bucket", "upper-case"},
		{"s3://ab", "3 to 63"},
		{"s3://-bucket", "only a-z"},
		{"s3://bucket_x", "only a-z"},
		{"s3://bucket:9000/x", "no port"},
		{"s3://bucket/../x", `".." path segment`},
		{"s3://bucket//x", "absolute"},
		{"s3://bucket/a//b", "empty path segment"},
		{"s3://bucket/a%00b", "control character"},
		{"s3://bucket/x?versionId=1", "query"},
		{"s3://bucket/x#frag", "query or fragment"},
		{"file://data/in", `host "data"`},
		{"file:data/in", "relative file path"},
		{"file:", "missing directory"},
		{"file:///a%00b", "control character"},
		{"file:///a?x", "query"},
	} {
		_, err := blob.ParseURL(tc.in)
		if !errors.Is(err, blob.ErrInvalidURL) || !blob.IsPermanent(err) {
			t.Errorf("ParseURL(%q) = %v, want ErrInvalidURL", tc.in, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("ParseURL(%q) = %q, want it to say %q", tc.in, err, tc.msg)
		}
	}
}

func TestParseURLHidesCredentials(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		"s3://AKIAEXAMPLE:wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY@bucket/x",
		"s3://AKIAEXAMPLE:wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY@bucket/x%zz",
		"file://user:wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY@localhost/x",
	} {
		_, err := blob.ParseURL(in)
		if err == nil {
			t.Fatalf("ParseURL(%q) accepted credentials", in)
		}
		if strings.Contains(err.Error(), "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY") {
			t.Errorf("ParseURL error shows the secret: %v", err)
		}
	}
}

func TestSplitURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in  string
		loc blob.Location
		key string
	}{
		{"s3://bucket/a/b.txt", blob.Location{Scheme: "s3", Bucket: "bucket"}, "a/b.txt"},
		{"s3://bucket/x", blob.Location{Scheme: "s3", Bucket: "bucket"}, "x"},
		{"file:///srv/in/a.txt", blob.Location{Scheme: "file", Dir: "/srv/in"}, "a.txt"},
	} {
		loc, key, err := blob.SplitURL(tc.in)
		if err != nil || loc != tc.loc || key != tc.key {
			t.Errorf("SplitURL(%q) = %+v, %q, %v; want %+v, %q", tc.in, loc, key, err, tc.loc, tc.key)
		}
	}
	for _, in := range []string{"s3://bucket", "s3://bucket/", "s3://bucket/a/../../b", "s3://bucket/a/", "file:///srv/in/", "file:///srv/..", "file:///"} {
		if loc, key, err := blob.SplitURL(in); !errors.Is(err, blob.ErrInvalidURL) {
			t.Errorf("SplitURL(%q) = %+v, %q, %v; want ErrInvalidURL", in, loc, key, err)
		}
	}
}

func TestContains(t *testing.T) {
	t.Parallel()
	s3in := blob.Location{Scheme: "s3", Bucket: "bucket", Prefix: "in/"}
	fin := blob.Location{Scheme: "file", Dir: "/srv/in"}
	for _, tc := range []struct {
		l    blob.Location
		url  string
		key  string
		want bool
	}{
		{s3in, "s3://bucket/in/a/b", "a/b", true},
		{s3in, "s3://bucket/in/x", "x", true},
		{s3in, "s3://bucket/inx/y", "", false},
		{s3in, "s3://bucket/other/y", "", false},
		{s3in, "s3://other/in/y", "", false},
		{s3in, "file:///srv/in/x", "", false},
		{fin, "file:///srv/in/x", "x", true},
		{fin, "file:///srv/in/a/b/c", "a/b/c", true},
		{fin, "file:///srv/inx/y", "", false},
		{fin, "file:///srv/x", "", false},
		{fin, "file:///etc/passwd", "", false},
		{fin, "file:///srv/in/../in2/x", "", false},
	} {
		o, k, err := blob.SplitURL(tc.url)
		if err != nil {
			t.Fatalf("SplitURL(%q): %v", tc.url, err)
		}
		key, ok := tc.l.Contains(o, k)
		if ok != tc.want || key != tc.key {
			t.Errorf("%v.Contains(%q) = %q, %v; want %q, %v", tc.l, tc.url, key, ok, tc.key, tc.want)
		}
	}
}

// FuzzParseURL checks that ParseURL never panics, that what it accepts
// prints back to itself, and that an accepted prefix is a safe one.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"s3://bucket/prefix", "file:///srv/data", "s3://b/../x", "file://host/x", "s3://a:b@bucket",
		"file:///a/%2e%2e/b", "s3://bucket/%2e%2e/x", "s3://bucket/a%5cb", "file:/x", "s3:x", "::", "s3://b.b/x/",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		loc, err := blob.ParseURL(raw)
		if err != nil {
			if !errors.Is(err, blob.ErrInvalidURL) {
				t.Fatalf("ParseURL(%q) = %v, not ErrInvalidURL", raw, err)
			}
			return
		}
		again, err := blob.ParseURL(loc.String())
		if err != nil || again != loc {
			t.Fatalf("ParseURL(%q) = %+v; its String %q parses to %+v, %v", raw, loc, loc.String(), again, err)
		}
		switch loc.Scheme {
		case "s3":
			if loc.Prefix != "" && (blob.ValidateKey(loc.Prefix+"x") != nil || !strings.HasSuffix(loc.Prefix, "/")) {
				t.Fatalf("ParseURL(%q) accepted prefix %q", raw, loc.Prefix)
			}
		case "file":
			if !strings.HasPrefix(loc.Dir, "/") || strings.Contains(loc.Dir, "/../") || strings.ContainsRune(loc.Dir, 0) {
				t.Fatalf("ParseURL(%q) accepted dir %q", raw, loc.Dir)
			}
		default:
			t.Fatalf("ParseURL(%q) = scheme %q", raw, loc.Scheme)
		}
	})
}
