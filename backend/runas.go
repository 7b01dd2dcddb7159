package backend

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// ErrRunAs means Config.RunAs names no usable user: unknown, root, or
// another user while the worker does not run as root.
var ErrRunAs = errors.New("cannot run the program as that user")

// lookupUser turns a user name or numeric uid (optionally :GROUP, a group
// name or gid) into the credential the program runs with: the user's uid,
// primary group (or GROUP) and supplementary groups.
func lookupUser(spec string) (*syscall.Credential, error) {
	name, group, hasGroup := strings.Cut(spec, ":")
	if name == "" {
		return nil, fmt.Errorf("%w: %q: give a user name or uid, optionally with :group", ErrRunAs, spec)
	}
	cred := &syscall.Credential{}
	u, err := user.Lookup(name)
	if err != nil {
		u, err = user.LookupId(name)
	}
	switch {
	case err == nil:
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		cred.Uid, cred.Gid = uint32(uid), uint32(gid)
		gids, _ := u.GroupIds()
		for _, g := range gids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil && uint32(n) != cred.Gid {
				cred.Groups = append(cred.Groups, uint32(n))
			}
		}
	case isNumber(name) && hasGroup:
		// A uid without a passwd entry: the group must be given.
		uid, _ := strconv.ParseUint(name, 10, 32)
		cred.Uid = uint32(uid)
	default:
		return nil, fmt.Errorf("%w: %q: no such user (give a user name, or UID:GID for a user without a passwd entry)", ErrRunAs, spec)
	}
	if cred.Groups == nil {
		cred.Groups = []uint32{} // drop the worker's supplementary groups
	}
	if hasGroup {
		g, err := user.LookupGroup(group)
		if err != nil {
			g, err = user.LookupGroupId(group)
		}
		switch {
		case err == nil:
			gid, _ := strconv.ParseUint(g.Gid, 10, 32)
			cred.Gid = uint32(gid)
		case isNumber(group):
			gid, _ := strconv.ParseUint(group, 10, 32)
			cred.Gid = uint32(gid)
		default:
			return nil, fmt.Errorf("%w: %q: no such group %q", ErrRunAs, spec, group)
		}
	}
	if cred.Uid == 0 {
		return nil, fmt.Errorf("%w: %q: that is root; name an unprivileged user", ErrRunAs, spec)
	}
	if euid := os.Geteuid(); euid != 0 && uint32(euid) != cred.Uid {
		return nil, fmt.Errorf("%w: %q: the worker runs as uid %d and can start programs as another user only when it starts as root", ErrRunAs, spec, euid)
	}
	return cred, nil
}

func isNumber(s string) bool {
	_, err := strconv.ParseUint(s, 10, 32)
	return err == nil
}

// chownTree hands the directory tree at root (not following links) to the
// program's user, so that it can read its input and write its outputs.
func chownTree(root string, cred *syscall.Credential) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(cred.Uid), int(cred.Gid))
	})
}

// errNoAccess means the program's user cannot reach a path.
var errNoAccess = errors.New("not reachable")

// checkAccess reports whether the user of cred can search every directory
// on the way to path and then use path itself with the permission bits in
// want (0o1 execute or search, 0o2 write, 0o4 read), going by the mode
// bits alone (ACLs are not read).
func checkAccess(path string, want fs.FileMode, cred *syscall.Credential) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	var dirs []string
	for d := filepath.Dir(abs); ; d = filepath.Dir(d) {
		dirs = append(dirs, d)
		if d == "/" {
			break
		}
	}
	slices.Reverse(dirs)
	for _, d := range dirs {
		if err := allowed(d, 0o1, cred); err != nil {
			return err
		}
	}
	return allowed(abs, want, cred)
}

func allowed(path string, want fs.FileMode, cred *syscall.Credential) error {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	mode := fs.FileMode(st.Mode) & fs.ModePerm
	var bits fs.FileMode
	switch {
	case st.Uid == cred.Uid:
		bits = mode >> 6
	case st.Gid == cred.Gid || slices.Contains(cred.Groups, st.Gid):
		bits = mode >> 3
	default:
		bits = mode
	}
	if bits&want != want {
		return fmt.Errorf("%w: %s has mode %04o, owner %d, group %d", errNoAccess, path, mode, st.Uid, st.Gid)
	}
	return nil
}
