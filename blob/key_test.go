package blob_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgworker/pgworker/blob"
)

// hostileKeys are keys that must never reach the file system or a bucket.
var hostileKeys = []string{
	"",
	"..",
	"../x",
	"a/../../x",
	"a/..",
	"./a",
	"a/./b",
	"/etc/passwd",
	"//server/share",
	"a//b",
	"a/",
	"a\x00b",
	"a\nb",
	"a\rb",
	"\x7f",
	"..\\x",
	"a\\..\\..\\x",
	"C:\\Windows",
	"\xff\xfe",
	".pgworker-tmp-ABC",
	"a/.pgworker-tmp-x",
	strings.Repeat("a", 256),
	strings.Repeat("a/", 600) + "a",
}

func TestValidateKey(t *testing.T) {
	t.Parallel()
	valid := []string{
		"a",
		"a.txt",
		"dir/sub/file.bin",
		"..a",
		"a..",
		"...",
		".hidden",
		"a b/c d",
		"ünïcödé/文件",
		"a:b",
		"C:",
		"~/x",
		"$HOME",
		strings.Repeat("a", 255),
	}
	for _, k := range valid {
		if err := blob.ValidateKey(k); err != nil {
			t.Errorf("ValidateKey(%q) = %v, want nil", k, err)
		}
	}
	for _, k := range hostileKeys {
		err := blob.ValidateKey(k)
		if !errors.Is(err, blob.ErrInvalidKey) {
			t.Errorf("ValidateKey(%q) = %v, want ErrInvalidKey", k, err)
			continue
		}
		if !blob.IsPermanent(err) {
			t.Errorf("ValidateKey(%q): error not permanent", k)
		}
		if strings.ContainsRune(err.Error(), 0) || strings.ContainsRune(err.Error(), '\n') {
			t.Errorf("ValidateKey(%q): message carries a raw control character: %q", k, err.Error())
		}
	}
}

func TestLocalPath(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p, err := blob.LocalPath(dir, "a/b/c.txt")
	if err != nil || p != filepath.Join(dir, "a", "b", "c.txt") {
		t.Fatalf("LocalPath = %q, %v", p, err)
	}
	for _, k := range hostileKeys {
		if p, err := blob.LocalPath(dir, k); !errors.Is(err, blob.ErrInvalidKey) {
			t.Errorf("LocalPath(%q) = %q, %v; want ErrInvalidKey", k, p, err)
		}
	}

	// A link below dir, to outside it, is refused on the way in and out.
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if p, err := blob.LocalPath(dir, "link/x"); !errors.Is(err, blob.ErrInvalidKey) {
		t.Errorf("LocalPath through a link = %q, %v; want ErrInvalidKey", p, err)
	}
	if p, err := blob.LocalPath(dir, "link"); !errors.Is(err, blob.ErrInvalidKey) {
		t.Errorf("LocalPath to a link = %q, %v; want ErrInvalidKey", p, err)
	}
}

func TestLocalKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tc := range []struct {
		path, key string
		ok        bool
	}{
		{filepath.Join(dir, "out.txt"), "out.txt", true},
		{filepath.Join(dir, "sub", "x.bin"), "sub/x.bin", true},
		{dir, "", false},
		{filepath.Join(dir, "..", "x"), "", false},
		{"/etc/passwd", "", false},
		{"relative", "", false},
		{filepath.Join(dir, "a\\b"), "", false},
		{filepath.Join(dir, ".pgworker-tmp-1"), "", false},
	} {
		key, err := blob.LocalKey(dir, tc.path)
		if tc.ok && (err != nil || key != tc.key) {
			t.Errorf("LocalKey(%q) = %q, %v; want %q", tc.path, key, err, tc.key)
		}
		if !tc.ok && !errors.Is(err, blob.ErrInvalidKey) {
			t.Errorf("LocalKey(%q) = %q, %v; want ErrInvalidKey", tc.path, key, err)
		}
	}

	// A program that links its output to a secret does not get it uploaded.
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("s3cr3t"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "innocent.txt")
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	if key, err := blob.LocalKey(dir, link); !errors.Is(err, blob.ErrInvalidKey) {
		t.Errorf("LocalKey(link) = %q, %v; want ErrInvalidKey", key, err)
	}
}

// FuzzValidateKey checks that any key ValidateKey accepts joins below the
// directory, and comes back as the same key.
func FuzzValidateKey(f *testing.F) {
	for _, k := range hostileKeys {
		f.Add(k)
	}
	for _, k := range []string{"a", "a/b", "..a/b..", "a/b/", "%2e%2e/x", "a/\u2024\u2024/b", "\u00a0", "a\u202e"} {
		f.Add(k)
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, key string) {
		err := blob.ValidateKey(key)
		p, perr := blob.LocalPath(dir, key)
		if (err == nil) != (perr == nil) {
			t.Fatalf("ValidateKey(%q) = %v but LocalPath = %v", key, err, perr)
		}
		if err != nil {
			if !errors.Is(err, blob.ErrInvalidKey) {
				t.Fatalf("ValidateKey(%q) = %v, not ErrInvalidKey", key, err)
			}
			return
		}
		rel, rerr := filepath.Rel(dir, p)
		if rerr != nil || !filepath.IsLocal(rel) {
			t.Fatalf("key %q joins to %q, outside %q", key, p, dir)
		}
		if filepath.Clean(p) != p {
			t.Fatalf("key %q joins to unclean %q", key, p)
		}
		back, kerr := blob.LocalKey(dir, p)
		if kerr != nil || back != key {
			t.Fatalf("LocalKey(LocalPath(%q)) = %q, %v", key, back, kerr)
		}
		for _, bad := range []string{"\x00", "\\", "//"} {
			if strings.Contains(key, bad) {
				t.Fatalf("accepted key %q holds %q", key, bad)
			}
		}
	})
}
