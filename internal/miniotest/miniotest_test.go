package miniotest

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

func live(t *testing.T, s *Server) bool {
	t.Helper()
	resp, err := http.Get(s.Endpoint + "/minio/health/live")
	if err != nil {
		return false
	}
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()
	return resp.StatusCode == http.StatusOK
}

func TestStopStartKeepsData(t *testing.T) {
	s := New(t)
	bucket := s.Bucket(t)
	if !live(t, s) {
		t.Fatal("server not live after start")
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if live(t, s) {
		t.Fatal("server still live after Stop")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	ok, err := s.client.BucketExists(context.Background(), bucket)
	if err != nil || !ok {
		t.Fatalf("bucket %s after restart: exists=%v err=%v", bucket, ok, err)
	}
}

func TestSharedIsShared(t *testing.T) {
	t.Parallel()
	a, b := Shared(t), Shared(t)
	if a != b {
		t.Fatal("Shared started two servers")
	}
	if a.Bucket(t) == b.Bucket(t) {
		t.Fatal("two buckets with one name")
	}
}

func TestBucketName(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"TestX", "TestRoundTrip/s3/empty_object", strings.Repeat("Long", 30), "", "--"} {
		b := bucketName(name)
		if len(b) < 3 || len(b) > 63 || strings.Trim(b, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
			t.Errorf("bucketName(%q) = %q: not a valid bucket name", name, b)
		}
	}
}

func TestMissingBinary(t *testing.T) {
	t.Setenv("PGWORKER_TEST_MINIO", "/nonexistent/minio")
	if _, err := Binary(); err == nil || !strings.Contains(err.Error(), "PGWORKER_TEST_MINIO") {
		t.Fatalf("Binary() error = %v, want one naming PGWORKER_TEST_MINIO", err)
	}
}
