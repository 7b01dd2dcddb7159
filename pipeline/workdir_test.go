package pipeline_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgworker/pgworker/backend"
	"github.com/pgworker/pgworker/blob"
	"github.com/pgworker/pgworker/pipeline"
)

// newWith returns a handler on file:// stores, with cfg's settings, whose
// backend runs command, and the directory of its output store.
func newWith(t *testing.T, command string, cfg pipeline.Config) (*pipeline.Handler, string, error) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	for _, d := range []string{"in", "out"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "in", "a.txt"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	in, err := blob.Open(ctx, "file://"+filepath.Join(dir, "in"), nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := blob.Open(ctx, "file://"+filepath.Join(dir, "out"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); out.Close() })
	runner, err := backend.New(&backend.Config{Command: command})
	if err != nil {
		t.Skip(err)
	}
	cfg.Resolver, cfg.Output, cfg.Runner = blob.NewResolver(in), out, runner
	if cfg.WorkDir == "" {
		cfg.WorkDir = filepath.Join(dir, "work")
	}
	h, err := pipeline.New(&cfg)
	return h, filepath.Join(dir, "out"), err
}

// uploaded returns the files in an output store's directory.
func uploaded(t *testing.T, out string) []string {
	t.Helper()
	var files []string
	_ = filepath.WalkDir(out, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, strings.TrimPrefix(p, out+"/"))
		}
		return nil
	})
	return files
}

// A work directory that another user could change is refused, with a
// message that says how to fix it; a sticky directory above it (as /tmp)
// is fine.
func TestWorkDirRefused(t *testing.T) {
	t.Parallel()
	const nobody = 65534
	root := os.Geteuid() == 0
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns the work directory
		root  bool                                  // needs root (chown)
		want  string                                // in the error; "" for accepted
	}{
		{"world-writable", func(t *testing.T, dir string) string {
			return mkdir(t, filepath.Join(dir, "w"), 0o777)
		}, false, "chmod go-w"},
		{"group-writable", func(t *testing.T, dir string) string {
			return mkdir(t, filepath.Join(dir, "w"), 0o770)
		}, false, "chmod go-w"},
		{"another user's", func(t *testing.T, dir string) string {
			w := mkdir(t, filepath.Join(dir, "w"), 0o700)
			chown(t, w, nobody)
			return w
		}, true, "belongs to uid 65534"},
		{"a link to another user's", func(t *testing.T, dir string) string {
			w := mkdir(t, filepath.Join(dir, "theirs"), 0o700)
			chown(t, w, nobody)
			if err := os.Symlink(w, filepath.Join(dir, "w")); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(dir, "w")
		}, true, "belongs to uid 65534"},
		{"below a world-writable, not sticky directory", func(t *testing.T, dir string) string {
			mkdir(t, filepath.Join(dir, "shared"), 0o777)
			return mkdir(t, filepath.Join(dir, "shared", "w"), 0o700)
		}, false, "chmod +t"},
		{"below another user's directory", func(t *testing.T, dir string) string {
			p := mkdir(t, filepath.Join(dir, "theirs"), 0o755)
			w := mkdir(t, filepath.Join(p, "w"), 0o700)
			chown(t, p, nobody)
			return w
		}, true, "belongs to uid 65534, who could replace"},
		{"below a sticky world-writable directory", func(t *testing.T, dir string) string {
			mkdir(t, filepath.Join(dir, "tmp"), 0o777|os.ModeSticky)
			return mkdir(t, filepath.Join(dir, "tmp", "w"), 0o700)
		}, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if tt.root && !root {
				t.Skip("needs root to give a directory to another user")
			}
			workDir := tt.setup(t, t.TempDir())
			_, _, err := newWith(t, "true", pipeline.Config{WorkDir: workDir})
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want == "":
			case err == nil:
				t.Fatalf("accepted, want a refusal that says %q", tt.want)
			case !errors.Is(err, pipeline.ErrUnsafeWorkDir) || !strings.Contains(err.Error(), tt.want):
				t.Fatalf("got %v, want ErrUnsafeWorkDir saying %q", err, tt.want)
			}
		})
	}
}

// A missing work directory is created with mode 0700, and so are the
// directories missing above it, whatever the umask.
func TestWorkDirCreatedPrivate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	workDir := filepath.Join(dir, "a", "b", "work")
	if _, _, err := newWith(t, "true", pipeline.Config{WorkDir: workDir}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "a"), filepath.Join(dir, "a", "b"), workDir} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o700 {
			t.Errorf("%s created with mode %04o, want 0700", p, fi.Mode().Perm())
		}
	}
}

// The default is systemd's state directory when set, else the user's
// cache directory: never a directory other users share.
func TestDefaultWorkDir(t *testing.T) {
	t.Setenv("STATE_DIRECTORY", "/var/lib/pgworker:/var/lib/other")
	if got, err := pipeline.DefaultWorkDir(); err != nil || got != "/var/lib/pgworker/work" {
		t.Errorf("with STATE_DIRECTORY: %q, %v", got, err)
	}
	t.Setenv("STATE_DIRECTORY", "")
	t.Setenv("XDG_CACHE_HOME", "/home/u/.cache")
	if got, err := pipeline.DefaultWorkDir(); err != nil || got != "/home/u/.cache/pgworker" {
		t.Errorf("without STATE_DIRECTORY: %q, %v", got, err)
	}
}

func mkdir(t *testing.T, p string, mode os.FileMode) string {
	t.Helper()
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func chown(t *testing.T, p string, uid int) {
	t.Helper()
	if err := os.Chown(p, uid, uid); err != nil {
		t.Fatal(err)
	}
}
