package term

import (
	"io"
	"reflect"
	"unsafe"

	uv "github.com/charmbracelet/ultraviolet"
	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/ansi/parser"
	"github.com/charmbracelet/x/vt"
)

const (
	// maxSequenceData bounds the data of one OSC, DCS, APC, PM or SOS
	// sequence that the parser keeps (vt sets 4 MiB); the rest is dropped.
	maxSequenceData = 64 << 10
	// maxStringArg bounds the data of the OSC sequences whose argument vt
	// keeps as a string (title, icon name, working directory) or parses by
	// splitting; longer ones are ignored.
	maxStringArg = 4 << 10
	// maxCluster bounds the bytes of a run of non-ASCII bytes that reach the
	// emulator in one write. vt gathers the characters of a grapheme
	// cluster until an ASCII character or the end of a write and keeps the
	// whole cluster in one cell, so a run of combining marks would otherwise
	// put all of a write in one cell.
	maxCluster = 256
)

// harden bounds what the emulator keeps and does for any output.
//
// Some bounds need fields vt v0.1.0 does not export, reached by reflection
// (vtInternals): both screens keep a scrollback of 10,000 lines (up to
// 22 KB a line at 200 columns; the alternate screen's cannot be set at all)
// that Text never shows, so it is removed; the parser's 4 MiB buffer for
// sequence data is cut to 64 KiB; and a line feed that scrolls the whole
// width of the screen rotates the rows rather than letting vt copy every
// cell of the region (1.3 MB at 60 × 200, for each line of a flood; see
// fastIndex; feed also turns wraps at the bottom into line feeds and leaves
// out lines that would scroll off unseen). If a later vt lays its fields
// out otherwise, these are skipped (TestHardened fails) and the main
// screen's scrollback is cut to its minimum through the exported API.
func harden(s *Screen) {
	e := s.em
	if in, ok := vtInternals(e); ok {
		s.vt = in
		for _, scr := range in.scrs {
			scr.SetScrollback(nil)
		}
		in.parser.SetDataSize(maxSequenceData)
		for _, c := range []byte{ansi.LF, ansi.VT, ansi.FF} {
			in.cc[c] = append(in.cc[c], s.fastLinefeed)
		}
		in.cc[ansi.IND] = append(in.cc[ansi.IND], s.fastIndex)
		e.RegisterEscHandler('D', s.fastIndex)
	} else {
		e.SetScrollbackSize(1)
	}

	// Counts past the screen's size change nothing more, but vt loops over
	// them (a 12-byte CSI 2000000000 X runs for seconds): clamp them.
	for _, c := range []byte{
		'@', // ICH
		'C', // CUF
		'D', // CUB
		'I', // CHT
		'P', // DCH
		'X', // ECH
		'Z', // CBT
		'a', // HPR
	} {
		e.RegisterCsiHandler(int(c), clampParams(func() int { return e.Width() }))
	}
	for _, c := range []byte{
		'A', // CUU
		'B', // CUD
		'E', // CNL
		'F', // CPL
		'L', // IL
		'M', // DL
		'S', // SU
		'T', // SD
		'e', // VPR
	} {
		e.RegisterCsiHandler(int(c), clampParams(func() int { return e.Height() }))
	}
	// Margins past the screen: vt keeps them, and a later DL, IL or scroll
	// indexes rows or columns that are not there (a panic: CSI 1;99 r CSI M
	// on a screen of fewer rows). Clamp them to the screen.
	e.RegisterCsiHandler('r', clampParams(func() int { return e.Height() })) // DECSTBM
	e.RegisterCsiHandler('s', clampParams(func() int { return e.Width() }))  // DECSLRM

	// REP: past a screenful the screen only scrolls through the same
	// character; keep the count's remainder by the width, so the cursor
	// ends where it would.
	e.RegisterCsiHandler('b', func(params ansi.Params) bool {
		w, h := e.Width(), e.Height()
		if len(params) > 0 {
			n := params[0].Param(1)
			if full := w * (h + 1); n > full {
				params[0] = ansi.Param(full + (n-full)%w)
			}
		}
		return false
	})

	// DSR 5 (operating status): xterm answers CSI 0 n; vt answers the DEC
	// form CSI ? 0 n, which programs asking CSI 5 n do not expect.
	e.RegisterCsiHandler('n', func(params ansi.Params) bool {
		if n, _, ok := params.Param(0, 0); ok && n == 5 && len(params) == 1 {
			io.WriteString(e.InputPipe(), "\x1b[0n")
			return true
		}
		return false
	})

	// Hyperlinks: a cell keeps its link's URL and parameters as strings of
	// up to the sequence data's size; Text does not show them. Drop them.
	e.RegisterOscHandler(8, func([]byte) bool { return true })
	// The others keep or split their argument: ignore long ones.
	for _, c := range []int{0, 1, 2, 7, 10, 11, 12, 110, 111, 112} {
		e.RegisterOscHandler(c, func(data []byte) bool { return len(data) > maxStringArg })
	}
}

// clampParams returns a CSI handler that caps the parameters of a sequence
// at limit() and lets vt's own handler (registered before) act on them.
func clampParams(limit func() int) vt.CsiHandler {
	return func(params ansi.Params) bool {
		l := limit()
		for i, p := range params {
			v := int(p) & parser.ParamMask
			if v != parser.MissingParam && v > l {
				params[i] = ansi.Param(l | int(p)&parser.HasMoreFlag)
			}
		}
		return false
	}
}

// vtPrivate is what vtInternals reaches in a vt.Emulator.
type vtPrivate struct {
	scrs      [2]*vt.Screen           // main and alternate screen
	bufs      [2]*uv.RenderBuffer     // their cells
	parser    *ansi.Parser            // the output's parser
	atPhantom *bool                   // the cursor waits past the last column
	cc        map[byte][]vt.CcHandler // handlers of control characters, the last first
}

// vtInternals reaches the unexported fields of e that harden needs, having
// checked their names and types.
func vtInternals(e *vt.Emulator) (in *vtPrivate, ok bool) {
	field := func(v reflect.Value, name string, t reflect.Type) (unsafe.Pointer, bool) {
		f := v.FieldByName(name)
		if !f.IsValid() || f.Type() != t {
			return nil, false
		}
		return unsafe.Pointer(f.UnsafeAddr()), true
	}
	v := reflect.ValueOf(e).Elem()
	in = new(vtPrivate)
	scrs, ok1 := field(v, "scrs", reflect.TypeFor[[2]vt.Screen]())
	pp, ok2 := field(v, "parser", reflect.TypeFor[*ansi.Parser]())
	phantom, ok3 := field(v, "atPhantom", reflect.TypeFor[bool]())
	cc, ok4 := field(v, "ccHandlers", reflect.TypeFor[map[byte][]vt.CcHandler]())
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return nil, false
	}
	for i := range in.scrs {
		in.scrs[i] = &(*[2]vt.Screen)(scrs)[i]
		buf, ok := field(reflect.ValueOf(in.scrs[i]).Elem(), "buf", reflect.TypeFor[*uv.RenderBuffer]())
		if !ok {
			return nil, false
		}
		in.bufs[i] = *(**uv.RenderBuffer)(buf)
	}
	in.parser = *(**ansi.Parser)(pp)
	in.atPhantom = (*bool)(phantom)
	in.cc = *(*map[byte][]vt.CcHandler)(cc)
	return in, in.parser != nil && in.cc != nil && in.bufs[0] != nil && in.bufs[1] != nil
}

// fastLinefeed handles a line feed (LF, VT, FF) as fastIndex does, but in
// line feed/new line mode, where it is also a carriage return, leaves it to
// vt.
func (s *Screen) fastLinefeed() bool {
	return !s.lnm && s.fastIndex()
}

// fastIndex handles an index (IND, and a line feed) at the bottom of a
// scroll region as wide as the screen, that of every line of a flood: it
// does what vt's does (Screen.ScrollUp(1): the region's rows move up one, a
// blank row in the current background comes in at the bottom, the lines
// are marked touched, the cursor stays, a pending wrap is cancelled) but
// rotates the rows instead of copying every cell of the region. It leaves
// any other index to vt.
func (s *Screen) fastIndex() bool {
	i := 0
	if s.em.IsAltScreen() {
		i = 1
	}
	scr, buf := s.vt.scrs[i], s.vt.bufs[i]
	region := scr.ScrollRegion()
	x, y := scr.CursorPosition()
	w := buf.Width()
	if y != region.Max.Y-1 || region.Min.X != 0 || region.Max.X != w || x < 0 || x >= w ||
		region.Min.Y < 0 || region.Max.Y > buf.Height() || region.Min.Y >= region.Max.Y {
		return false
	}
	lines := buf.Lines
	top, bottom := region.Min.Y, region.Max.Y
	first := lines[top]
	copy(lines[top:bottom-1], lines[top+1:bottom])
	lines[bottom-1] = first
	blank := uv.EmptyCell
	if bg := scr.Cursor().Pen.Bg; bg != nil {
		blank.Style.Bg = bg
	}
	for x := range first {
		first[x] = blank
	}
	for y := top; y <= bottom; y++ {
		buf.TouchLine(0, y, w)
	}
	*s.vt.atPhantom = false
	return true
}

// feed writes p to the emulator, leaving out the lines of a flood that
// would scroll off the screen before it is seen (see scrolledOut). It
// splits p only after a CR LF: a split elsewhere could part a grapheme
// cluster (vt ends one at the end of each write).
func (s *Screen) feed(p []byte) {
	start, from := 0, 0 // p[start:] is not written; from is where to look
	for {
		h, t, end, ok := s.scrolledOut(p[from:])
		if !ok {
			break
		}
		h, t, end = from+h, from+t, from+end
		s.feedBytes(p[start:h])
		if s.atBottomLeft() {
			start, from = t, t
		} else {
			// Plain bytes change none of what atBottomLeft looks at
			// (p[:h] ends with a CR LF): look past them.
			start, from = h, end
		}
	}
	s.feedBytes(p[start:])
}

// scrolledOut finds in p plain lines — printable ASCII, tabs, backspaces,
// carriage returns, line feeds — that would scroll off the screen before
// the end of p: p[h:t], in a run of plain bytes that ends at end, such that
//   - p[:h] ends with at least as many line feeds as the screen has rows,
//     the last after a carriage return, and a printable character: once it
//     is written, if the scroll region is the whole screen (atBottomLeft),
//     the cursor is at the start of the bottom row, with nothing pending;
//   - p[h:t] is whole lines, ending with a carriage return and line feed:
//     writing them scrolls the screen and leaves the cursor where it was;
//   - p[t:] begins with at least as many plain lines as the screen has
//     rows, holding a printable character, so they scroll all of p[h:t]
//     off the screen, and set the character a REP repeats.
//
// Leaving out p[h:t] then changes nothing but the time writing p takes.
func (s *Screen) scrolledOut(p []byte) (h, t, end int, ok bool) {
	if s.vt == nil {
		return 0, 0, 0, false
	}
	for a := 0; a < len(p); {
		if !plain(p[a]) {
			a++
			continue
		}
		b := a
		for b < len(p) && plain(p[b]) {
			b++
		}
		if h, t, ok := linesToSkip(p[a:b], s.rows); ok {
			return a + h, a + t, b, true
		}
		a = b
	}
	return 0, 0, 0, false
}

// linesToSkip is scrolledOut within q, all plain bytes.
func linesToSkip(q []byte, rows int) (h, t int, ok bool) {
	// h: after the rows-th line feed or the first CR LF after it, with a
	// printable character before.
	lf, printable := 0, false
	for i, c := range q {
		if c >= 0x20 {
			printable = true
		}
		if c != '\n' {
			continue
		}
		lf++
		if lf >= rows && printable && i > 0 && q[i-1] == '\r' {
			h = i + 1
			break
		}
	}
	if h == 0 {
		return 0, 0, false
	}
	// t: after the last CR LF that has rows line feeds and a printable
	// character after it.
	lf, printable = 0, false
	for i := len(q) - 1; i >= h; i-- {
		c := q[i]
		if c >= 0x20 {
			printable = true
		}
		if c != '\n' {
			continue
		}
		if lf >= rows && printable && q[i-1] == '\r' {
			t = i + 1
			break
		}
		lf++
	}
	return h, t, t > h
}

func plain(c byte) bool {
	return c >= 0x20 && c < 0x7f || c == '\r' || c == '\n' || c == '\t' || c == '\b'
}

// atBottomLeft reports whether the cursor is at the start of the bottom row
// of a scroll region that is the whole screen, the parser in its ground
// state, nothing pending: where plain lines scroll the whole screen.
func (s *Screen) atBottomLeft() bool {
	i := 0
	if s.em.IsAltScreen() {
		i = 1
	}
	scr := s.vt.scrs[i]
	x, y := scr.CursorPosition()
	return s.vt.parser.State() == parser.GroundState && !*s.vt.atPhantom &&
		scr.ScrollRegion() == scr.Bounds() && x == 0 && y == s.rows-1
}

// feedBytes writes p to the emulator in pieces that hold no run of more
// than maxCluster non-ASCII bytes (see maxCluster); a piece may end inside
// a character, as the parser keeps its state from one write to the next.
// Runs of printable ASCII go through feedRun.
func (s *Screen) feedBytes(p []byte) {
	start, run := 0, 0
	for i := 0; i < len(p); i++ {
		b := p[i]
		if b >= 0x80 {
			run++
			if run > maxCluster {
				s.em.Write(p[start:i])
				start, run = i, 1
			}
			continue
		}
		run = 0
		if b < 0x20 || b == 0x7f || s.vt == nil {
			continue
		}
		j := i + 1
		for j < len(p) && p[j] >= 0x20 && p[j] < 0x7f {
			j++
		}
		if j-i >= minWrapRun {
			if start < i {
				s.em.Write(p[start:i])
			}
			start = i + s.feedRun(p[i:j])
		}
		i = j - 1
	}
	if start < len(p) {
		s.em.Write(p[start:])
	}
}

// minWrapRun is the shortest run of printable ASCII that feedRun looks at.
const minWrapRun = 16

// feedRun writes the part of run, a run of printable ASCII characters, that
// ends where its last line wrap at the right margin falls, putting a CR LF
// in place of each such wrap, and returns how many bytes it wrote (0 if it
// left the run alone). vt's wrap at the bottom of the screen scrolls by
// copying every cell of the scroll region; the line feed goes through
// fastLinefeed. A wrap is a CR LF there, and the characters after it land
// where they would, when: the parser is in its ground state (the run is
// printed), autowrap is on, origin mode is off and there is no left margin
// (a CR goes to column 0).
func (s *Screen) feedRun(run []byte) int {
	i := 0
	if s.em.IsAltScreen() {
		i = 1
	}
	scr := s.vt.scrs[i]
	if s.vt.parser.State() != parser.GroundState || s.noWrap || s.origin || scr.ScrollRegion().Min.X != 0 {
		return 0
	}
	w := s.em.Width()
	x, _ := scr.CursorPosition()
	phantom := *s.vt.atPhantom
	fed := 0
	for k := range run {
		if phantom {
			s.em.Write(run[fed:k])
			s.em.Write(crlf)
			fed, x, phantom = k, 0, false
		}
		if x >= w-1 {
			phantom = true
		} else {
			x++
		}
	}
	return fed
}

var crlf = []byte("\r\n")
