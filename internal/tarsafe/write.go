package tarsafe

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"time"
)

// Header sets the ownership, name prefix and time of the entries FromFS
// writes.
type Header struct {
	// Uid and Gid are stored as the owner of every entry.
	Uid, Gid int
	// Prefix, if non-empty, is a relative slash-separated directory
	// (such as "workspace/") that every entry name is placed under; the
	// walked root itself becomes an entry for that directory.
	Prefix string
	// ModTime, if non-zero, replaces every entry's modification time.
	ModTime time.Time
}

// FromFS writes to w a PAX-format tar stream of the tree rooted at root in
// fsys ("." for all of it), in [fs.WalkDir] order. Entry names are relative
// to root and placed under h.Prefix; owners come from h, permission bits
// (without setuid, setgid or sticky) and times from the files. Directories
// and regular files are written, symlinks too if fsys implements
// [fs.ReadLinkFS]; any other file type is an error. Without a prefix the
// root directory itself gets no entry.
func FromFS(w io.Writer, fsys fs.FS, root string, h Header) error {
	prefix := path.Clean(h.Prefix)
	if h.Prefix != "" && !fs.ValidPath(prefix) {
		return fmt.Errorf("tarsafe: invalid prefix %q", h.Prefix)
	}
	tw := tar.NewWriter(w)
	err := fs.WalkDir(fsys, root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := p // WalkDir passes root and paths below it: root + "/" + rel
		if root != "." {
			rel = strings.TrimPrefix(p[len(root):], "/")
		}
		name := path.Join(prefix, rel)
		if name == "." {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr := &tar.Header{
			Name:    name,
			Mode:    int64(info.Mode().Perm()),
			Uid:     h.Uid,
			Gid:     h.Gid,
			ModTime: info.ModTime(),
			Format:  tar.FormatPAX,
		}
		if !h.ModTime.IsZero() {
			hdr.ModTime = h.ModTime
		}
		switch mode := info.Mode(); {
		case mode.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
		case mode.IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, info.Size()
		case mode&fs.ModeSymlink != 0:
			rl, ok := fsys.(fs.ReadLinkFS)
			if !ok {
				return fmt.Errorf("tarsafe: %s: symlink in a file system without ReadLink", p)
			}
			if hdr.Linkname, err = rl.ReadLink(p); err != nil {
				return err
			}
			hdr.Typeflag = tar.TypeSymlink
		default:
			return fmt.Errorf("tarsafe: %s: unsupported file type %v", p, mode.Type())
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("tarsafe: %s: %w", p, err)
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := fsys.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		// Exactly the announced size; a file that shrank is an error.
		if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
			return fmt.Errorf("tarsafe: %s: %w", p, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// SingleFile writes to w a PAX-format tar stream holding one regular file
// called name (a base name: non-empty, no slash, not "." or "..") with the
// given contents, the permission bits of mode, owner uid:gid and the current
// time.
func SingleFile(w io.Writer, name string, data []byte, mode fs.FileMode, uid, gid int) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("tarsafe: SingleFile name %q is not a base name", name)
	}
	tw := tar.NewWriter(w)
	err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg,
		Name:     name,
		Mode:     int64(mode.Perm()),
		Size:     int64(len(data)),
		Uid:      uid,
		Gid:      gid,
		ModTime:  time.Now(),
		Format:   tar.FormatPAX,
	})
	if err == nil {
		_, err = tw.Write(data)
	}
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		return fmt.Errorf("tarsafe: %w", err)
	}
	return nil
}
