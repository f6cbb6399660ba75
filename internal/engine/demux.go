package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Demux returns a reader of the standard output carried by r, an attach
// stream of a container without a TTY, in the engine's multiplexed form
// (8-byte headers: stream, 3 zero bytes, big-endian length). Standard
// error goes to stderr as it comes. Unlike stdcopy.StdCopy it needs no
// goroutine and no pipe: each Read of the returned reader reads r directly
// into the caller's buffer.
func Demux(r io.Reader, stderr io.Writer) io.Reader { return &demux{r: r, stderr: stderr} }

type demux struct {
	r      io.Reader
	stderr io.Writer
	left   int // bytes of standard output left in the current frame
}

// maxSystemErr bounds the error message of a "system error" frame.
const maxSystemErr = 64 << 10

func (d *demux) Read(p []byte) (int, error) {
	for d.left == 0 {
		var h [8]byte
		if _, err := io.ReadFull(d.r, h[:]); err != nil {
			if err == io.ErrUnexpectedEOF {
				return 0, fmt.Errorf("engine: attach stream cut in a frame header: %w", err)
			}
			return 0, err
		}
		n := int64(binary.BigEndian.Uint32(h[4:]))
		switch h[0] {
		case 1: // stdout
			d.left = int(n)
		case 2: // stderr
			if _, err := io.CopyN(d.stderr, d.r, n); err != nil {
				return 0, noEOF(err)
			}
		case 3: // an error of the engine
			msg := make([]byte, min(n, maxSystemErr))
			if _, err := io.ReadFull(d.r, msg); err != nil {
				return 0, noEOF(err)
			}
			return 0, fmt.Errorf("engine: attach stream: %s", msg)
		default:
			if _, err := io.CopyN(io.Discard, d.r, n); err != nil {
				return 0, noEOF(err)
			}
		}
	}
	if len(p) > d.left {
		p = p[:d.left]
	}
	n, err := d.r.Read(p)
	d.left -= n
	if err == io.EOF && d.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	if err == io.EOF && n > 0 {
		err = nil // reported by the next Read
	}
	return n, err
}

func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
