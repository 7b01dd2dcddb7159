package blob_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pgworker/pgworker/blob"
)

// putMode is one way of uploading.
type putMode struct {
	name string
	put  func(ctx context.Context, t *testing.T, s blob.Store, key string, seed byte, n int64) (blob.Info, error)
}

var putModes = []putMode{
	{"Put", func(ctx context.Context, _ *testing.T, s blob.Store, key string, seed byte, n int64) (blob.Info, error) {
		return s.Put(ctx, key, pattern(seed, n), n)
	}},
	{"PutUnknownSize", func(ctx context.Context, _ *testing.T, s blob.Store, key string, seed byte, n int64) (blob.Info, error) {
		return s.Put(ctx, key, pattern(seed, n), -1)
	}},
	{"PutFile", func(ctx context.Context, t *testing.T, s blob.Store, key string, seed byte, n int64) (blob.Info, error) {
		return s.PutFile(ctx, key, writePattern(t, t.TempDir(), seed, n))
	}},
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	sizes := []struct {
		name string
		size int64
	}{
		{"empty", 0},
		{"small", 1000},
		{"part", 5 << 20},         // exactly one part in the tests' part size
		{"large", 40<<20 + 12345}, // eight multipart parts and a bit
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := b.open(t, blob.Options{})
			for _, sz := range sizes {
				for i, pm := range putModes {
					t.Run(sz.name+"/"+pm.name, func(t *testing.T) {
						if sz.size > 1<<20 && testing.Short() {
							t.Skip("large object in -short")
						}
						seed := byte(i + 1)
						want := patternSum(seed, sz.size)
						key := "rt/" + sz.name + "/" + pm.name + ".bin"

						info, err := pm.put(ctx, t, s, key, seed, sz.size)
						if err != nil {
							t.Fatalf("put: %v", err)
						}
						if info.Key != key || info.Size != sz.size || info.SHA256 != want {
							t.Fatalf("put info = %+v, want key %s, size %d, sha256 %s", info, key, sz.size, want)
						}

						st, err := s.Stat(ctx, key)
						if err != nil || st.Size != sz.size {
							t.Fatalf("stat = %+v, %v", st, err)
						}
						if b.name == "s3" && st.SHA256 != want {
							t.Errorf("stat: sha256 metadata = %q, want %s", st.SHA256, want)
						}

						w := newHashWriter()
						got, err := s.Get(ctx, key, w)
						if err != nil || got.Size != sz.size || got.SHA256 != want || w.sum() != want {
							t.Fatalf("get = %+v, %v; wrote %d bytes with sha256 %s; want %s", got, err, w.n, w.sum(), want)
						}

						path := filepath.Join(t.TempDir(), "sub", "dir", "in.bin")
						got, err = s.GetFile(ctx, key, path)
						if err != nil || got.SHA256 != want || fileSum(t, path) != want {
							t.Fatalf("get file = %+v, %v", got, err)
						}
						assertOnlyFiles(t, filepath.Dir(path), "in.bin")
					})
				}
			}
		})
	}
}

// assertOnlyFiles fails when dir holds other files than names (such as
// temporary files left behind).
func assertOnlyFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, names) {
		t.Errorf("%s holds %q, want %q", dir, got, names)
	}
}

func TestOverwrite(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := b.open(t, blob.Options{})
			for _, body := range []string{"first version", "second"} {
				if _, err := s.Put(ctx, "k", strings.NewReader(body), int64(len(body))); err != nil {
					t.Fatal(err)
				}
			}
			var buf bytes.Buffer
			if _, err := s.Get(ctx, "k", &buf); err != nil || buf.String() != "second" {
				t.Fatalf("get = %q, %v", buf.String(), err)
			}
		})
	}
}

func TestList(t *testing.T) {
	t.Parallel()
	keys := []string{"a.txt", "a/b.txt", "a/c/d.txt", "a-b", "b/x", "ab"}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := b.open(t, blob.Options{})
			for _, k := range keys {
				if _, err := s.Put(ctx, k, strings.NewReader(k), -1); err != nil {
					t.Fatal(err)
				}
			}
			for _, tc := range []struct {
				prefix string
				want   []string
			}{
				{"", []string{"a-b", "a.txt", "a/b.txt", "a/c/d.txt", "ab", "b/x"}},
				{"a/", []string{"a/b.txt", "a/c/d.txt"}},
				{"a", []string{"a-b", "a.txt", "a/b.txt", "a/c/d.txt", "ab"}},
				{"a/c", []string{"a/c/d.txt"}},
				{"a/c/d.txt", []string{"a/c/d.txt"}},
				{"b/", []string{"b/x"}},
				{"zzz", nil},
				{"zzz/", nil},
				{"a.txt/", nil},
			} {
				var got []string
				for info, err := range s.List(ctx, tc.prefix) {
					if err != nil {
						t.Fatalf("list %q: %v", tc.prefix, err)
					}
					if info.Size != int64(len(info.Key)) {
						t.Errorf("list %q: %s has size %d", tc.prefix, info.Key, info.Size)
					}
					got = append(got, info.Key)
				}
				if !slices.Equal(got, tc.want) {
					t.Errorf("list %q = %q, want %q", tc.prefix, got, tc.want)
				}
			}

			// Stopping early is fine.
			n := 0
			for _, err := range s.List(ctx, "") {
				if err != nil {
					t.Fatal(err)
				}
				if n++; n == 2 {
					break
				}
			}

			for _, p := range []string{"../", "/a", "a//", "a\\b", "a/../b"} {
				for _, err := range s.List(ctx, p) {
					if !errors.Is(err, blob.ErrInvalidKey) {
						t.Errorf("list %q: err = %v, want ErrInvalidKey", p, err)
					}
				}
			}
		})
	}
}

func TestMissing(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := b.open(t, blob.Options{})
			check := func(op string, err error) {
				t.Helper()
				if !errors.Is(err, blob.ErrNotFound) || !blob.IsPermanent(err) {
					t.Errorf("%s: err = %v, want permanent ErrNotFound", op, err)
					return
				}
				if msg := err.Error(); !strings.Contains(msg, s.Location().String()) || !strings.Contains(msg, `"no/such.bin"`) {
					t.Errorf("%s: %q does not name the store and key", op, msg)
				}
			}
			_, err := s.Get(ctx, "no/such.bin", io.Discard)
			check("get", err)
			_, err = s.Stat(ctx, "no/such.bin")
			check("stat", err)

			// A failed GetFile leaves what was at the path, and no temporary file.
			dir := t.TempDir()
			path := filepath.Join(dir, "in.bin")
			if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err = s.GetFile(ctx, "no/such.bin", path)
			check("get file", err)
			if b, _ := os.ReadFile(path); string(b) != "old" {
				t.Errorf("failed GetFile changed the file to %q", b)
			}
			assertOnlyFiles(t, dir, "in.bin")

			if err := s.Delete(ctx, "no/such.bin"); err != nil {
				t.Errorf("delete of a missing object: %v", err)
			}
			if _, err := s.PutFile(ctx, "k", filepath.Join(dir, "absent")); !errors.Is(err, blob.ErrNotFound) {
				t.Errorf("put of a missing file: err = %v, want ErrNotFound", err)
			}
		})
	}
}

func TestDelete(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := b.open(t, blob.Options{})
			if _, err := s.Put(ctx, "d/x", strings.NewReader("x"), 1); err != nil {
				t.Fatal(err)
			}
			if err := s.Delete(ctx, "d/x"); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Stat(ctx, "d/x"); !errors.Is(err, blob.ErrNotFound) {
				t.Errorf("stat after delete: %v", err)
			}
		})
	}
}

func TestPutSizeMismatch(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := b.open(t, blob.Options{})
			for _, tc := range []struct {
				name       string
				have, said int64
			}{
				{"short", 10, 20},
				{"long", 20, 10},
				{"short-multipart", 6 << 20, 12 << 20},
				{"long-multipart", 12 << 20, 6 << 20},
				{"long-by-one", 5<<20 + 1, 5 << 20},
			} {
				key := "mismatch/" + tc.name
				if _, err := s.Put(ctx, key, pattern(1, tc.have), tc.said); err == nil {
					t.Errorf("%s: put of %d bytes announced as %d succeeded", tc.name, tc.have, tc.said)
				}
				if _, err := s.Stat(ctx, key); !errors.Is(err, blob.ErrNotFound) {
					t.Errorf("%s: a failed put left an object: %v", tc.name, err)
				}
			}
		})
	}
}

func TestHostileKeys(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := b.open(t, blob.Options{})
			src := filepath.Join(t.TempDir(), "src")
			if err := os.WriteFile(src, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			dest := t.TempDir()
			for _, k := range hostileKeys {
				ops := map[string]error{}
				_, ops["get"] = s.Get(ctx, k, io.Discard)
				_, ops["get file"] = s.GetFile(ctx, k, filepath.Join(dest, "f"))
				_, ops["put"] = s.Put(ctx, k, strings.NewReader("x"), 1)
				_, ops["put file"] = s.PutFile(ctx, k, src)
				_, ops["stat"] = s.Stat(ctx, k)
				ops["delete"] = s.Delete(ctx, k)
				for op, err := range ops {
					if !errors.Is(err, blob.ErrInvalidKey) || !blob.IsPermanent(err) {
						t.Errorf("%s %q: err = %v, want ErrInvalidKey", op, k, err)
					}
				}
			}
			for info, err := range s.List(ctx, "") {
				t.Errorf("a hostile key left an object: %+v, %v", info, err)
			}
			assertOnlyFiles(t, dest)
		})
	}
}

func TestPutFileRefusesLinks(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			s := b.open(t, blob.Options{})
			dir := t.TempDir()
			secret := filepath.Join(dir, "secret")
			if err := os.WriteFile(secret, []byte("s3cr3t"), 0o600); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(dir, "out.txt")
			if err := os.Symlink(secret, link); err != nil {
				t.Fatal(err)
			}
			if _, err := s.PutFile(context.Background(), "out.txt", link); !errors.Is(err, blob.ErrInvalidKey) {
				t.Errorf("PutFile of a link: err = %v, want ErrInvalidKey", err)
			}
			if _, err := s.PutFile(context.Background(), "out.txt", dir); !errors.Is(err, blob.ErrNotFound) {
				t.Errorf("PutFile of a directory: err = %v, want ErrNotFound", err)
			}
			hard := filepath.Join(dir, "hard.txt")
			if err := os.Link(secret, hard); err != nil {
				t.Fatal(err)
			}
			if _, err := s.PutFile(context.Background(), "hard.txt", hard); !errors.Is(err, blob.ErrInvalidKey) || !strings.Contains(err.Error(), "hard links") {
				t.Errorf("PutFile of a file with two hard links: err = %v, want ErrInvalidKey naming the links", err)
			}
			if _, err := s.Stat(context.Background(), "hard.txt"); !errors.Is(err, blob.ErrNotFound) {
				t.Errorf("the hard-linked file was stored: Stat err = %v", err)
			}
		})
	}
}

func TestCancelled(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			s := b.open(t, blob.Options{})
			if _, err := s.Put(context.Background(), "k", pattern(1, 6<<20), -1); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_, err := s.Get(ctx, "k", io.Discard)
			if !errors.Is(err, context.Canceled) || blob.IsPermanent(err) {
				t.Errorf("get: err = %v, want context.Canceled, not permanent", err)
			}
			_, err = s.Put(ctx, "k2", pattern(1, 6<<20), -1)
			if !errors.Is(err, context.Canceled) || blob.IsPermanent(err) {
				t.Errorf("put: err = %v, want context.Canceled, not permanent", err)
			}
		})
	}
}
