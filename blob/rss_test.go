package blob_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"testing"

	"github.com/pgworker/pgworker/blob"
	"github.com/pgworker/pgworker/internal/miniotest"
)

const bigSize = 256 << 20

// TestPeakRSS moves a 256 MiB object up and down in a fresh process and
// checks that the process never held a copy of it: its peak RSS stays below
// the object's size. A fresh process, so that what other tests allocated
// does not count.
func TestPeakRSS(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 256 MiB")
	}
	if peakRSS() < 0 {
		t.Skip("no getrusage here")
	}
	t.Parallel()
	srv := miniotest.Shared(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestRSSHelper$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(),
		"BLOB_RSS_HELPER=1",
		"BLOB_RSS_ENDPOINT="+srv.Endpoint,
		"BLOB_RSS_BUCKET="+srv.Bucket(t),
		"BLOB_RSS_ACCESS_KEY="+srv.AccessKey,
		"BLOB_RSS_SECRET_KEY="+srv.SecretKey,
		"BLOB_RSS_DIR="+t.TempDir(),
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`peak_rss_mib=([0-9.]+)`).FindAllSubmatch(out, -1)
	if len(m) == 0 {
		t.Fatalf("helper did not report its peak RSS:\n%s", out)
	}
	rss, _ := strconv.ParseFloat(string(m[len(m)-1][1]), 64)
	t.Logf("peak RSS moving a 256 MiB object both ways over both backends: %.0f MiB (race detector on: %v)", rss, raceEnabled)
	if rss >= bigSize>>20 {
		t.Errorf("peak RSS %.0f MiB is not below the object's 256 MiB: something holds the whole object\n%s", rss, out)
	}
}

// TestRSSHelper is the process that TestPeakRSS runs.
func TestRSSHelper(t *testing.T) {
	if os.Getenv("BLOB_RSS_HELPER") == "" {
		t.Skip("run by TestPeakRSS")
	}
	ctx := context.Background()
	dir := os.Getenv("BLOB_RSS_DIR")
	src := writePattern(t, dir, 9, bigSize)
	want := patternSum(9, bigSize)
	s3, err := blob.Open(ctx, "s3://"+os.Getenv("BLOB_RSS_BUCKET"), &blob.Options{
		Endpoint:        os.Getenv("BLOB_RSS_ENDPOINT"),
		AccessKeyID:     os.Getenv("BLOB_RSS_ACCESS_KEY"),
		SecretAccessKey: os.Getenv("BLOB_RSS_SECRET_KEY"),
		Region:          "us-east-1",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	if err := os.Mkdir(filepath.Join(dir, "store"), 0o755); err != nil {
		t.Fatal(err)
	}
	file, err := blob.Open(ctx, fileURL(filepath.Join(dir, "store")), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	fmt.Printf("start peak_rss_mib=%.1f\n", peakRSS())
	for _, s := range []blob.Store{s3, file} {
		name := s.Location().Scheme
		check := func(step string, info blob.Info, err error) {
			t.Helper()
			if err != nil || info.SHA256 != want {
				t.Fatalf("%s %s = %+v, %v", name, step, info, err)
			}
			fmt.Printf("%s %s peak_rss_mib=%.1f\n", name, step, peakRSS())
			// Let the next step reuse this one's freed memory: the race
			// detector's shadow of fresh addresses would otherwise add up.
			runtime.GC()
		}
		info, err := s.PutFile(ctx, "big", src)
		check("PutFile", info, err)
		f, err := os.Open(src)
		if err != nil {
			t.Fatal(err)
		}
		info, err = s.Put(ctx, "big-stream", struct{ io.Reader }{f}, -1)
		f.Close()
		check("Put(size -1)", info, err)
		info, err = s.GetFile(ctx, "big-stream", filepath.Join(dir, "down"))
		check("GetFile", info, err)
		info, err = s.Get(ctx, "big", io.Discard)
		check("Get", info, err)
	}
}

// BenchmarkS3 moves a 256 MiB object to and from the shared MinIO with the
// default options (16 MiB parts) and reports throughput (MB/s) and the
// process's peak RSS. Run it alone for a clean RSS figure:
//
//	go test -run '^$' -bench S3 -benchtime 3x ./blob/
func BenchmarkS3(b *testing.B) {
	srv := miniotest.Shared(b)
	ctx := context.Background()
	s, err := blob.Open(ctx, "s3://"+srv.Bucket(b), &blob.Options{
		Endpoint: srv.Endpoint, AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey, Region: "us-east-1",
	})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	dir := b.TempDir()
	src := writePattern(b, dir, 5, bigSize)
	for _, bc := range []struct {
		name string
		run  func() (blob.Info, error)
	}{
		{"PutFile", func() (blob.Info, error) { return s.PutFile(ctx, "big", src) }},
		{"PutStream", func() (blob.Info, error) {
			f, err := os.Open(src)
			if err != nil {
				return blob.Info{}, err
			}
			defer f.Close()
			return s.Put(ctx, "big-stream", struct{ io.Reader }{f}, -1)
		}},
		{"GetFile", func() (blob.Info, error) { return s.GetFile(ctx, "big", filepath.Join(dir, "down")) }},
		{"Get", func() (blob.Info, error) { return s.Get(ctx, "big", io.Discard) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(bigSize)
			b.ReportAllocs()
			for b.Loop() {
				if info, err := bc.run(); err != nil || info.Size != bigSize {
					b.Fatalf("%+v, %v", info, err)
				}
			}
			b.ReportMetric(peakRSS(), "peak-RSS-MiB")
		})
	}
}
