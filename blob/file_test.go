package blob_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgworker/pgworker/blob"
)

func TestFileStoreOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	missing := filepath.Join(t.TempDir(), "not-mounted")
	_, err := blob.Open(ctx, fileURL(missing), nil)
	if !errors.Is(err, blob.ErrNotFound) || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("open of a missing directory: err = %v", err)
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("open created the directory")
	}
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := blob.Open(ctx, fileURL(file), nil); !errors.Is(err, blob.ErrNotFound) {
		t.Errorf("open of a file: err = %v", err)
	}
	if _, err := blob.Open(ctx, "file:relative/dir", nil); !errors.Is(err, blob.ErrInvalidURL) {
		t.Errorf("open of a relative path: err = %v", err)
	}
}

// TestFileStoreLinks checks that links inside the store root cannot lead
// reads, writes, deletes or listings outside it.
func TestFileStoreLinks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	root := t.TempDir()
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("s3cr3t"), 0o600); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink(outside, filepath.Join(root, "dirlink")))
	must(os.Symlink(filepath.Join(outside, "secret"), filepath.Join(root, "filelink")))
	must(os.Symlink("../"+filepath.Base(outside)+"/secret", filepath.Join(root, "rellink")))
	must(os.WriteFile(filepath.Join(root, "inside"), []byte("ok"), 0o644))
	must(os.Symlink("inside", filepath.Join(root, "goodlink")))
	must(os.Mkdir(filepath.Join(root, "sub"), 0o755))
	must(os.Symlink("..", filepath.Join(root, "sub", "up")))

	rec := &recorder{}
	s := openStore(t, fileURL(root), blob.Options{Logger: slog.New(rec)})

	for _, k := range []string{"dirlink/secret", "filelink", "rellink", "sub/up/sub/up/inside"} {
		_, err := s.Get(ctx, k, io.Discard)
		if k == "sub/up/sub/up/inside" {
			// Links that stay inside the root are followed.
			if err != nil {
				t.Errorf("get %q (inside the root): %v", k, err)
			}
			continue
		}
		if !errors.Is(err, blob.ErrInvalidKey) || !blob.IsPermanent(err) {
			t.Errorf("get %q: err = %v, want ErrInvalidKey", k, err)
		}
	}
	if _, err := s.Put(ctx, "dirlink/planted", strings.NewReader("x"), 1); !errors.Is(err, blob.ErrInvalidKey) {
		t.Errorf("put through a link: err = %v, want ErrInvalidKey", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "planted")); err == nil {
		t.Errorf("put wrote outside the root")
	}
	if err := s.Delete(ctx, "dirlink/secret"); !errors.Is(err, blob.ErrInvalidKey) {
		t.Errorf("delete through a link: err = %v, want ErrInvalidKey", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "secret")); err != nil {
		t.Errorf("delete removed a file outside the root: %v", err)
	}

	var listed []string
	for info, err := range s.List(ctx, "") {
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, info.Key)
	}
	if want := []string{"goodlink", "inside"}; strings.Join(listed, ",") != strings.Join(want, ",") {
		t.Errorf("list = %q, want %q", listed, want)
	}
	if rec.count("skipping") == 0 {
		t.Errorf("no warning for the links skipped:\n%s", rec)
	}
	if _, err := s.Get(ctx, "goodlink", io.Discard); err != nil {
		t.Errorf("get through a link inside the root: %v", err)
	}
}

// TestFileStoreSkipsOddNames checks that names that are not valid keys, and
// temporary files of writes in progress, are not listed.
func TestFileStoreSkipsOddNames(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for _, name := range []string{"ok", "back\\slash", "new\nline", ".pgworker-tmp-XYZ", "\xff"} {
		if err := os.WriteFile(filepath.Join(root, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := openStore(t, fileURL(root), blob.Options{})
	var listed []string
	for info, err := range s.List(context.Background(), "") {
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, info.Key)
	}
	if len(listed) != 1 || listed[0] != "ok" {
		t.Errorf("list = %q, want [ok]", listed)
	}
}

func TestFileStoreKeyConflicts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := openFile(t, blob.Options{})
	if _, err := s.Put(ctx, "a", strings.NewReader("x"), 1); err != nil {
		t.Fatal(err)
	}
	// S3 could hold both "a" and "a/b"; a directory cannot.
	if _, err := s.Put(ctx, "a/b", strings.NewReader("x"), 1); !errors.Is(err, blob.ErrInvalidKey) {
		t.Errorf("put a/b over file a: err = %v, want ErrInvalidKey", err)
	}
	if _, err := s.Put(ctx, "d/x", strings.NewReader("x"), 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "d", strings.NewReader("x"), 1); !errors.Is(err, blob.ErrInvalidKey) {
		t.Errorf("put d over directory d: err = %v, want ErrInvalidKey", err)
	}
	if _, err := s.Get(ctx, "d", io.Discard); !errors.Is(err, blob.ErrNotFound) {
		t.Errorf("get of a directory: err = %v, want ErrNotFound", err)
	}
	if err := s.Delete(ctx, "d"); !errors.Is(err, blob.ErrNotFound) {
		t.Errorf("delete of a directory: err = %v, want ErrNotFound", err)
	}
}

func TestResolver(t *testing.T) {
	t.Parallel()
	in := openFile(t, blob.Options{})
	extra := openFile(t, blob.Options{})
	r := blob.NewResolver(in, extra)
	inURL := in.Location().String()
	for _, tc := range []struct {
		source string
		store  blob.Store
		key    string
	}{
		{"a/b.txt", in, "a/b.txt"},
		{inURL + "/x/y", in, "x/y"},
		{extra.Location().String() + "/z", extra, "z"},
	} {
		s, key, err := r.Resolve(tc.source)
		if err != nil || s != tc.store || key != tc.key {
			t.Errorf("Resolve(%q) = %v, %q, %v; want %v, %q", tc.source, s, key, err, tc.store.Location(), tc.key)
		}
	}
	for _, source := range []string{
		"../x", "/etc/passwd", "file:///etc/passwd", inURL + "/../escape", inURL + "/", "s3://bucket/x", "http://example.com/x", "a\x00b",
	} {
		if s, key, err := r.Resolve(source); err == nil || !blob.IsPermanent(err) {
			t.Errorf("Resolve(%q) = %v, %q, %v; want a permanent error", source, s, key, err)
		}
	}
	if _, _, err := blob.NewResolver(nil, extra).Resolve("plain"); !errors.Is(err, blob.ErrInvalidURL) {
		t.Errorf("plain key without an input store: err = %v", err)
	}
}
