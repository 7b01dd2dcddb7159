package blob

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// fileStore keeps objects as files below a directory. Every access goes
// through an os.Root, so neither ".." nor a symbolic link can lead outside the
// directory, whatever the key (which ValidateKey checks first anyway).
type fileStore struct {
	loc  Location
	root *os.Root
	s    *settings
}

func newFileStore(_ context.Context, loc Location, s *settings) (*fileStore, error) {
	fail := func(err error) (*fileStore, error) {
		return nil, &Error{Op: "open", Store: loc.String(), Err: err}
	}
	fi, err := os.Stat(loc.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return fail(classify(ErrNotFound, fmt.Errorf("directory %s does not exist (create it, or mount the share)", loc.Dir)))
	}
	if err != nil {
		return fail(fileErr(err))
	}
	if !fi.IsDir() {
		return fail(classify(ErrNotFound, fmt.Errorf("%s is not a directory", loc.Dir)))
	}
	root, err := os.OpenRoot(loc.Dir)
	if err != nil {
		return fail(fileErr(err))
	}
	return &fileStore{loc: loc, root: root, s: s}, nil
}

func (f *fileStore) Location() Location { return f.loc }
func (f *fileStore) Close() error       { return f.root.Close() }

func (f *fileStore) err(op, key string, err error) error {
	return &Error{Op: op, Store: f.loc.String(), Key: key, Err: err}
}

// fileErr classifies an error from the file system.
func fileErr(err error) error {
	var errno syscall.Errno
	var pe *fs.PathError
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return classify(ErrNotFound, err)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return classify(ErrPermission, err)
	case errors.Is(err, syscall.ELOOP):
		return classify(ErrInvalidKey, fmt.Errorf("symbolic link not followed: %w", err))
	case errors.As(err, &pe) && !errors.As(pe.Err, &errno):
		// os.Root's refusal of a path that escapes it ("path escapes from
		// parent") is the one PathError not carrying an errno.
		return classify(ErrInvalidKey, fmt.Errorf("leads outside the store root: %w", err))
	}
	return err
}

func (f *fileStore) Get(ctx context.Context, key string, w io.Writer) (Info, error) {
	if err := ValidateKey(key); err != nil {
		return Info{}, f.err("get", key, err)
	}
	var (
		file *os.File
		fi   fs.FileInfo
	)
	err := f.s.retry(ctx, "open "+key, func(context.Context) error {
		var err error
		if file, err = f.root.Open(filepath.FromSlash(key)); err != nil {
			return fileErr(err)
		}
		if fi, err = file.Stat(); err != nil {
			file.Close()
			return fileErr(err)
		}
		return nil
	})
	if err != nil {
		return Info{}, f.err("get", key, err)
	}
	defer file.Close()
	if !fi.Mode().IsRegular() {
		return Info{}, f.err("get", key, classify(ErrNotFound, errors.New("not a regular file")))
	}
	c := newCopier(0)
	if err := c.copyLocal(ctx, w, file); err != nil {
		return Info{}, f.err("get", key, err)
	}
	if c.n != fi.Size() {
		return Info{}, f.err("get", key, fmt.Errorf("%w: read %d bytes, the file had %d", ErrChanged, c.n, fi.Size()))
	}
	return Info{Key: key, Size: c.n, SHA256: c.sum(), Modified: fi.ModTime()}, nil
}

func (f *fileStore) GetFile(ctx context.Context, key, path string) (Info, error) {
	return getFile(ctx, f, key, path)
}

func (f *fileStore) Put(ctx context.Context, key string, r io.Reader, size int64) (Info, error) {
	if err := ValidateKey(key); err != nil {
		return Info{}, f.err("put", key, err)
	}
	info, err := f.put(ctx, key, r, size)
	if err != nil {
		return Info{}, f.err("put", key, err)
	}
	return info, nil
}

// put writes a temporary file next to the object, syncs it and renames it
// into place, so that a reader sees the old file or the new one, complete.
func (f *fileStore) put(ctx context.Context, key string, r io.Reader, size int64) (Info, error) {
	name := filepath.FromSlash(key)
	dir := filepath.Dir(name)
	if dir != "." {
		if err := f.root.MkdirAll(dir, 0o755); err != nil {
			if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, fs.ErrExist) {
				return Info{}, classify(ErrInvalidKey, fmt.Errorf("a parent of the key is a file: %w", err))
			}
			return Info{}, fileErr(err)
		}
	}
	tmp := filepath.Join(dir, tempPrefix+rand.Text())
	file, err := f.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
	if err != nil {
		return Info{}, fileErr(err)
	}
	done := false
	defer func() {
		if !done {
			file.Close()
			_ = f.root.Remove(tmp)
		}
	}()
	src := r
	if size >= 0 {
		src = io.LimitReader(r, size+1)
	}
	c := newCopier(0)
	if err := c.copyLocal(ctx, file, src); err != nil {
		return Info{}, err
	}
	if err := checkSize(c.n, size); err != nil {
		return Info{}, err
	}
	if err := file.Sync(); err != nil {
		return Info{}, fileErr(err)
	}
	fi, err := file.Stat()
	if err != nil {
		return Info{}, fileErr(err)
	}
	done = true
	if err := file.Close(); err != nil {
		_ = f.root.Remove(tmp)
		return Info{}, fileErr(err)
	}
	if err := f.root.Rename(tmp, name); err != nil {
		_ = f.root.Remove(tmp)
		if errors.Is(err, syscall.EISDIR) || errors.Is(err, fs.ErrExist) {
			return Info{}, classify(ErrInvalidKey, fmt.Errorf("a directory has the key's name: %w", err))
		}
		return Info{}, fileErr(err)
	}
	f.syncDir(dir)
	return Info{Key: key, Size: c.n, SHA256: c.sum(), Modified: fi.ModTime()}, nil
}

// checkSize compares the bytes a reader gave with the size the caller
// announced (-1: unknown).
func checkSize(n, size int64) error {
	switch {
	case size < 0 || n == size:
		return nil
	case n < size:
		return fmt.Errorf("reader ended after %d of %d bytes: %w", n, size, io.ErrUnexpectedEOF)
	default:
		return fmt.Errorf("reader has more than the %d bytes announced", size)
	}
}

// syncDir makes a rename durable. File systems that cannot sync a directory
// (some network ones) make their renames durable by other means.
func (f *fileStore) syncDir(dir string) {
	d, err := f.root.Open(dir)
	if err != nil {
		return
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOTSUP) {
		f.s.log.Warn("blob: sync directory", "store", f.loc.String(), "dir", dir, "err", err)
	}
}

func (f *fileStore) PutFile(ctx context.Context, key, path string) (Info, error) {
	if err := ValidateKey(key); err != nil {
		return Info{}, f.err("put", key, err)
	}
	file, size, err := openLocal(path)
	if err != nil {
		return Info{}, f.err("put", key, err)
	}
	defer file.Close()
	return f.Put(ctx, key, file, size)
}

func (f *fileStore) Stat(ctx context.Context, key string) (Info, error) {
	if err := ValidateKey(key); err != nil {
		return Info{}, f.err("stat", key, err)
	}
	var fi fs.FileInfo
	err := f.s.retry(ctx, "stat "+key, func(context.Context) error {
		var err error
		fi, err = f.root.Stat(filepath.FromSlash(key))
		return fileErr(err)
	})
	if err == nil && !fi.Mode().IsRegular() {
		err = classify(ErrNotFound, errors.New("not a regular file"))
	}
	if err != nil {
		return Info{}, f.err("stat", key, err)
	}
	return Info{Key: key, Size: fi.Size(), Modified: fi.ModTime()}, nil
}

func (f *fileStore) Delete(ctx context.Context, key string) error {
	if err := ValidateKey(key); err != nil {
		return f.err("delete", key, err)
	}
	name := filepath.FromSlash(key)
	fi, err := f.root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return nil
	case err != nil:
		return f.err("delete", key, fileErr(err))
	case fi.IsDir():
		return f.err("delete", key, classify(ErrNotFound, errors.New("a directory, not an object")))
	}
	if err := f.root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return f.err("delete", key, fileErr(err))
	}
	return nil
}

// List walks the directory in the order S3 lists keys: a directory's
// entries sorted as if directory names ended in "/".
func (f *fileStore) List(ctx context.Context, prefix string) iter.Seq2[Info, error] {
	return func(yield func(Info, error) bool) {
		if err := validatePrefix(prefix); err != nil {
			yield(Info{}, f.err("list", prefix, err))
			return
		}
		dir, filter := path.Split(prefix)
		dir = strings.TrimSuffix(dir, "/")
		if dir == "" {
			dir = "."
		}
		if _, err := f.walk(ctx, dir, filter, yield); err != nil {
			yield(Info{}, f.err("list", prefix, err))
		}
	}
}

// walk yields the files below dir (slash-separated, relative to the root)
// whose names in dir start with filter. It returns false when the consumer
// stopped.
func (f *fileStore) walk(ctx context.Context, dir, filter string, yield func(Info, error) bool) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	d, err := f.root.Open(filepath.FromSlash(dir))
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return true, nil // nothing below a missing prefix, as in S3
	}
	if err != nil {
		return false, fileErr(err)
	}
	entries, err := d.ReadDir(-1)
	d.Close()
	if errors.Is(err, syscall.ENOTDIR) {
		return true, nil // "a.txt/" lists nothing
	}
	if err != nil {
		return false, fileErr(err)
	}
	sortKey := func(e fs.DirEntry) string {
		if e.IsDir() {
			return e.Name() + "/"
		}
		return e.Name()
	}
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return cmp.Compare(sortKey(a), sortKey(b)) })
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, filter) || strings.HasPrefix(name, tempPrefix) {
			continue
		}
		key := name
		if dir != "." {
			key = dir + "/" + name
		}
		if ValidateKey(key) != nil {
			f.s.log.WarnContext(ctx, "blob: skipping a name that is not a valid key", "store", f.loc.String(), "name", key)
			continue
		}
		if e.IsDir() {
			if more, err := f.walk(ctx, key, "", yield); !more || err != nil {
				return more, err
			}
			continue
		}
		// Follow a link only inside the root (os.Root sees to that) and only
		// to a regular file: a linked directory could loop.
		fi, err := f.root.Stat(filepath.FromSlash(key))
		if err != nil || !fi.Mode().IsRegular() {
			if err == nil || !errors.Is(err, fs.ErrNotExist) {
				f.s.log.WarnContext(ctx, "blob: skipping an entry that is not a regular file in the store", "store", f.loc.String(), "name", key, "err", err)
			}
			continue
		}
		if !yield(Info{Key: key, Size: fi.Size(), Modified: fi.ModTime()}, nil) {
			return false, nil
		}
	}
	return true, nil
}

// copyLocal copies src to dst while hashing, checking ctx between chunks.
// Local files need no retry and no idle timer.
func (c *copier) copyLocal(ctx context.Context, dst io.Writer, src io.Reader) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		m, err := src.Read(c.buf)
		if m > 0 {
			if _, werr := dst.Write(c.buf[:m]); werr != nil {
				return werr
			}
			c.hash.Write(c.buf[:m])
			c.n += int64(m)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// openLocal opens a regular file for upload without following a symbolic
// link in its last element, and returns its size. The checks are made on
// the file opened, not on its name, so that nothing can swap it between
// them and the upload.
func openLocal(path string) (*os.File, int64, error) {
	file, err := openNoFollow(path)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, 0, classify(ErrInvalidKey, fmt.Errorf("%s is a symbolic link, which is not followed", path))
		}
		return nil, 0, fileErr(err)
	}
	fi, err := file.Stat()
	if err != nil {
		file.Close()
		return nil, 0, err
	}
	if !fi.Mode().IsRegular() {
		file.Close()
		return nil, 0, classify(ErrNotFound, fmt.Errorf("%s is not a regular file", path))
	}
	if n := hardLinks(fi); n > 1 {
		// Another name of the same file may be anywhere on the node: a
		// program could have linked /etc/shadow into its output.
		file.Close()
		return nil, 0, classify(ErrInvalidKey, fmt.Errorf("%s has %d hard links: a file with other names is not uploaded", path, n))
	}
	return file, fi.Size(), nil
}
