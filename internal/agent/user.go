//go:build linux

package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// resolveUser turns "uid", "uid:gid", "name" or "name:group" into numeric
// IDs, looking names up in the image's /etc/passwd and /etc/group. A
// numeric user without a group gets its passwd group if it has an entry,
// else the group of the same number.
func resolveUser(spec string) (uid, gid uint32, err error) {
	us, gs, hasGroup := strings.Cut(spec, ":")
	u, err := lookupID("/etc/passwd", us, 2)
	if err != nil {
		return 0, 0, fmt.Errorf("user %q: %w", us, err)
	}
	if hasGroup {
		g, err := lookupID("/etc/group", gs, 2)
		if err != nil {
			return 0, 0, fmt.Errorf("group %q: %w", gs, err)
		}
		return u, g, nil
	}
	// The user's primary group, from its passwd entry.
	if g, ok := passwdGroup(u); ok {
		return u, g, nil
	}
	return u, u, nil
}

// lookupID returns the number of name: name itself if numeric, else field
// idField (the ID) of the line of file whose first field is name.
func lookupID(file, name string, idField int) (uint32, error) {
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		return uint32(n), nil
	}
	var id uint32
	found := false
	err := eachEntry(file, func(f []string) bool {
		if len(f) > idField && f[0] == name {
			if n, err := strconv.ParseUint(f[idField], 10, 32); err == nil {
				id, found = uint32(n), true
				return false
			}
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("not found in %s", file)
	}
	return id, nil
}

// passwdGroup returns the primary group of uid from /etc/passwd.
func passwdGroup(uid uint32) (uint32, bool) {
	var gid uint32
	found := false
	eachEntry("/etc/passwd", func(f []string) bool {
		if len(f) > 3 && f[2] == strconv.FormatUint(uint64(uid), 10) {
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
