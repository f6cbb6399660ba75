package blob

import (
	"os"

	"golang.org/x/sys/unix"
)

// copyToFile copies the content to f's offset in the kernel
// (copy_file_range(2), from explicit offsets of the blob's file, so
// concurrent readers are not disturbed), as cat does. handled is false
// when the kernel copies nothing between these files (another file
// system before Linux 5.3 or since 5.19, f opened to append, f not a
// regular file): nothing was written, copy otherwise.
func (b *Blob) copyToFile(f *os.File) (n int64, handled bool, err error) {
	src, err := b.f.SyscallConn()
	if err != nil {
		return 0, false, nil
	}
	dst, err := f.SyscallConn()
	if err != nil {
		return 0, false, nil
	}
	var cerr error
	handled = true
	rerr := src.Read(func(sfd uintptr) bool {
		werr := dst.Write(func(dfd uintptr) bool {
			for n < b.size {
				m, err := unix.CopyFileRange(int(sfd), &n, int(dfd), nil, int(min(b.size-n, 1<<30)), 0)
				switch {
				case err == unix.EINTR:
					continue
				case err != nil && n == 0:
					handled = false // nothing copied: copy otherwise
				case err != nil:
					cerr = &os.PathError{Op: "copy_file_range", Path: f.Name(), Err: err}
				case m == 0:
					cerr = &os.PathError{Op: "copy_file_range", Path: f.Name(), Err: unix.EIO} // the blob shrank: never
				default:
					continue
				}
				break
			}
			return true
		})
		if cerr == nil {
			cerr = werr
		}
		return true
	})
	if cerr == nil {
		cerr = rerr
	}
	return n, handled, cerr
}
