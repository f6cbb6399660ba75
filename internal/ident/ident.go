// Package ident is the one parser of the sandbox user, as WithUser and
// Cmd.User take it: "uid", "uid:gid", "name" or "name:group" (and mixed
// forms), names looked up in the image's /etc/passwd and /etc/group. The
// library checks the form with Parse; the agent inside the sandbox
// resolves it with Resolve, for commands and for the sandbox's own user
// alike.
//
// A numeric user without a group gets its passwd group if the image has
// an entry for it, else the group of the same number; a named user
// without a group gets its passwd group.
package ident

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Spec is a parsed user: a user and an optional group, each a number or a
// name.
type Spec struct {
	User, Group string // Group "": the user's own
}

// Parse checks the form of spec.
func Parse(spec string) (Spec, error) {
	us, gs, hasGroup := strings.Cut(spec, ":")
	if !valid(us) || (hasGroup && !valid(gs)) {
		return Spec{}, fmt.Errorf("user %q is not \"uid\", \"uid:gid\", \"name\" or \"name:group\"", spec)
	}
	return Spec{User: us, Group: gs}, nil
}

// valid reports whether s is an ID (a number below 2^32-1) or a name as
// passwd and group entries have them: no colon, space or control
// character, not empty, at most 256 bytes.
func valid(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return n < 1<<32-1 // (uid_t)-1 means "unchanged"
	}
	for _, c := range []byte(s) {
		if c <= ' ' || c == ':' || c == 0x7f {
			return false
		}
	}
	return s[0] < '0' || s[0] > '9'
}

// Numeric returns the IDs of a spec of numbers only: "uid:gid".
func (s Spec) Numeric() (uid, gid uint32, ok bool) {
	u, err1 := strconv.ParseUint(s.User, 10, 32)
	g, err2 := strconv.ParseUint(s.Group, 10, 32)
	return uint32(u), uint32(g), err1 == nil && err2 == nil
}

func (s Spec) String() string {
	if s.Group == "" {
		return s.User
	}
	return s.User + ":" + s.Group
}

// Resolve turns spec into numeric IDs with the passwd and group files
// (paths; a missing file has no entries).
func Resolve(spec, passwd, group string) (uid, gid uint32, err error) {
	s, err := Parse(spec)
	if err != nil {
		return 0, 0, err
	}
	u, err := lookupID(passwd, s.User)
	if err != nil {
		return 0, 0, fmt.Errorf("user %q: %w", s.User, err)
	}
	if s.Group != "" {
		g, err := lookupID(group, s.Group)
		if err != nil {
			return 0, 0, fmt.Errorf("group %q: %w", s.Group, err)
		}
		return u, g, nil
	}
	if g, ok := passwdGroup(passwd, u); ok {
		return u, g, nil
	}
	return u, u, nil
}

// lookupID returns the number of name: name itself if numeric, else the
// ID field (the third) of the line of file whose first field is name.
func lookupID(file, name string) (uint32, error) {
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		return uint32(n), nil
	}
	var id uint32
	found := false
	err := eachEntry(file, func(f []string) bool {
		if len(f) > 2 && f[0] == name {
			if n, err := strconv.ParseUint(f[2], 10, 32); err == nil {
				id, found = uint32(n), true
				return false
			}
		}
		return true
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("not found in %s", file)
	}
	return id, nil
}

// passwdGroup returns the primary group of uid from the passwd file.
func passwdGroup(passwd string, uid uint32) (uint32, bool) {
	var gid uint32
	found := false
	want := strconv.FormatUint(uint64(uid), 10)
	eachEntry(passwd, func(f []string) bool {
		if len(f) > 3 && f[2] == want {
			if n, err := strconv.ParseUint(f[3], 10, 32); err == nil {
				gid, found = uint32(n), true
				return false
			}
		}
		return true
	})
	return gid, found
}

// eachEntry calls f with the colon-separated fields of each line of file
// (at most its first MiB) until f returns false.
func eachEntry(file string, f func([]string) bool) error {
	fh, err := os.Open(file)
	if err != nil {
		return err
	}
	defer fh.Close()
	sc := bufio.NewScanner(io.LimitReader(fh, 1<<20))
	for sc.Scan() {
		if !f(strings.Split(sc.Text(), ":")) {
			break
		}
	}
	return nil
}
