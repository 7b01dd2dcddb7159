package pipeline

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// ErrUnsafeWorkDir: the work directory, or a directory above it, lets
// another user change what the program reads and what is uploaded.
var ErrUnsafeWorkDir = errors.New("unsafe work directory")

// DefaultWorkDir returns the work directory of a process that is given
// none: $STATE_DIRECTORY/work when systemd's StateDirectory= sets
// STATE_DIRECTORY, else pgworker in the user's cache directory
// ($XDG_CACHE_HOME or ~/.cache on Linux, see os.UserCacheDir). Both are
// places no other user can reach, unlike a directory in /tmp.
func DefaultWorkDir() (string, error) {
	if s := os.Getenv("STATE_DIRECTORY"); s != "" {
		first, _, _ := strings.Cut(s, ":") // one path per StateDirectory= entry
		return filepath.Join(first, "work"), nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no default work directory (%v): give one with --work-dir or PGWORKER_WORK_DIR", err)
	}
	return filepath.Join(cache, "pgworker"), nil
}

// MakeWorkDir creates dir with mode 0700 if it is missing and checks that no
// other user can change what is in it: dir must belong to this process's
// effective user and be writable by nobody else, and every directory above
// it must belong to this user or to root and, when others may write to it,
// be sticky (as /tmp is), so that nobody else can rename dir away and put
// their own in its place. It returns dir as an absolute path with symbolic
// links resolved, the path the attempts use from then on. Refusals wrap
// ErrUnsafeWorkDir and say how to fix them.
func MakeWorkDir(dir string) (string, error) {
	if dir == "" {
		return "", errors.New("empty work directory path")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("work directory %s: %w", dir, err)
	}
	if err := createPrivate(abs); err != nil {
		return "", fmt.Errorf("create work directory %s: %w", abs, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("work directory %s: %w", abs, err)
	}
	fi, err := os.Lstat(real)
	if err != nil {
		return "", fmt.Errorf("work directory %s: %w", real, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("work directory %s is not a directory", real)
	}
	if err := checkOwnDir(real, fi); err != nil {
		return "", err
	}
	for p := filepath.Dir(real); ; p = filepath.Dir(p) {
		if err := checkAbove(p, real); err != nil {
			return "", err
		}
		if p == filepath.Dir(p) {
			return real, nil
		}
	}
}

// LetOthersSearch adds search permission for other users to dir, a work
// directory returned by MakeWorkDir, so that a program run as another user
// can reach its own job's directory inside. Others still cannot list dir,
// and each job's directory stays private to its user.
func LetOthersSearch(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o001 != 0 {
		return nil
	}
	return os.Chmod(dir, fi.Mode().Perm()|0o001)
}

// createPrivate creates dir, and the directories missing above it, with
// mode 0700 whatever the umask. An existing dir is left as it is.
func createPrivate(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := createPrivate(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil // made meanwhile; checked by the caller
		}
		return err
	}
	return os.Chmod(dir, 0o700)
}

func checkOwnDir(dir string, fi fs.FileInfo) error {
	uid, ok := owner(fi)
	me := os.Geteuid()
	if ok && int(uid) != me {
		return fmt.Errorf("%w: %s belongs to uid %d, not to this user (uid %d), who could change the inputs and outputs of the rows: "+
			"use a directory of your own (chown %d %s, or another --work-dir)", ErrUnsafeWorkDir, dir, uid, me, me, dir)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%w: %s is writable by other users (mode %04o), who could swap an attempt's output directory: "+
			"run chmod go-w %s (or use another --work-dir)", ErrUnsafeWorkDir, dir, fi.Mode().Perm(), dir)
	}
	return nil
}

// checkAbove checks a directory above the work directory.
func checkAbove(p, workDir string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("work directory %s: %w", workDir, err)
	}
	uid, ok := owner(fi)
	if ok && uid != 0 && int(uid) != os.Geteuid() {
		return fmt.Errorf("%w: %s, above the work directory %s, belongs to uid %d, who could replace the work directory: "+
			"choose a --work-dir below directories that belong to you or to root", ErrUnsafeWorkDir, p, workDir, uid)
	}
	if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0 {
		return fmt.Errorf("%w: %s, above the work directory %s, is writable by other users and not sticky (mode %04o), so they could rename the work directory away: "+
			"run chmod +t %s, or choose a --work-dir below directories only you or root can change", ErrUnsafeWorkDir, p, workDir, fi.Mode().Perm(), p)
	}
	return nil
}

// removeAll removes an attempt's directory. A program may have taken the
// permissions of what it wrote away (chmod 000 {output_dir}), which stops
// the removal unless the worker runs as root: the permissions of the
// directories below dir are given back, without following a symbolic link
// out of the work directory, and the removal tried again.
func removeAll(workDir, dir string) error {
	err := os.RemoveAll(dir)
	if err == nil {
		return nil
	}
	root, rerr := os.OpenRoot(workDir)
	if rerr != nil {
		return err
	}
	defer root.Close()
	restorePermissions(root, filepath.Base(dir))
	return os.RemoveAll(dir)
}

// restorePermissions makes name and the directories below it, inside root,
// readable, writable and searchable by their owner.
func restorePermissions(root *os.Root, name string) {
	fi, err := root.Lstat(name)
	if err != nil || !fi.IsDir() {
		return
	}
	if fi.Mode().Perm()&0o700 != 0o700 {
		_ = root.Chmod(name, fi.Mode().Perm()|0o700)
	}
	d, err := root.Open(name)
	if err != nil {
		return
	}
	entries, _ := d.ReadDir(-1)
	d.Close()
	for _, e := range entries {
		if e.IsDir() {
			restorePermissions(root, path.Join(name, e.Name()))
		}
	}
}
