package tools

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"sync"

	"github.com/agentsandbox/sandbox/internal/pseudofs"
)

// Bounds of the editor.
const (
	viewMaxBytes    = 16 << 10 // output of one view
	viewMaxLines    = 2000     // lines of one view
	maxFileBytes    = 32 << 20 // largest file the editor reads
	snippetContext  = 4        // lines shown around an edit
	maxUndo         = 10       // versions kept per path
	maxHistoryBytes = 64 << 20 // bytes kept for undo in one Set
	maxDirEntries   = 1000     // entries listed by view of a directory
	maxListedLines  = 10       // occurrence lines named by str_replace
	listConcurrency = 8        // directories read at once
)

func (t *Set) edit(ctx context.Context, c editorCall) (string, error) {
	if c.command == cmdView {
		return t.view(ctx, c)
	}
	unlock := t.lockPath(c.path)
	defer unlock()
	switch c.command {
	case cmdCreate:
		return t.create(ctx, c)
	case cmdStrReplace:
		return t.strReplace(ctx, c)
	case cmdInsert:
		return t.insert(ctx, c)
	default:
		return t.undo(ctx, c)
	}
}

// lockPath serialises edits of one path.
func (t *Set) lockPath(p string) (unlock func()) {
	t.mu.Lock()
	m := t.locks[p]
	if m == nil {
		m = &sync.Mutex{}
		t.locks[p] = m
	}
	t.mu.Unlock()
	m.Lock()
	return m.Unlock
}

func notExist(p string) string { return fmt.Sprintf("Error: The path %s does not exist.", p) }

// problem turns the error of a file operation into the model's message, or
// returns it when the sandbox, the engine or ctx failed.
func problem(ctx context.Context, err error, verb, p string) (string, error) {
	if isInfra(ctx, err) {
		return "", fmt.Errorf("tools: %s %s: %w", verb, p, err)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return notExist(p), nil
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return fmt.Sprintf("Error: Cannot %s %s: %v.", verb, p, err), nil
}

// pseudoFS reports whether p is on /proc, /sys or /dev, whose files may
// report size 0 and yet be endless.
func pseudoFS(p string) bool {
	_, ok := pseudofs.Under(p)
	return ok
}

// readText reads the regular file p for the editor. It returns the text,
// or a message for the model when the file is not a regular file, too
// large or binary.
func (t *Set) readText(ctx context.Context, p string, fi fs.FileInfo) (text, msg string, err error) {
	if !fi.Mode().IsRegular() {
		return "", fmt.Sprintf("Error: %s is not a regular file (%s); str_replace_editor handles text files and directories.", p, fileKind(fi.Mode())), nil
	}
	if fi.Size() > maxFileBytes {
		return "", tooLarge(p, fi.Size()), nil
	}
	var data []byte
	if pseudoFS(p) {
		data, err = t.readBounded(ctx, p)
	} else {
		data, err = t.sb.ReadFile(ctx, p)
	}
	if err != nil {
		msg, err := problem(ctx, err, "read", p)
		return "", msg, err
	}
	if len(data) > maxFileBytes {
		return "", tooLarge(p, int64(len(data))), nil
	}
	if isBinary(data) {
		return "", fmt.Sprintf("Error: %s is a binary file (%d bytes), so it is not shown: str_replace_editor handles text only. Use execute_bash to inspect it, for example `od -c %s | head`.",
			p, len(data), p), nil
	}
	return string(data), "", nil
}

func tooLarge(p string, size int64) string {
	return fmt.Sprintf("Error: %s is %d bytes, too large for str_replace_editor (at most %d). Use execute_bash to work on parts of it (head, tail, grep -n, sed -n '100,200p').",
		p, size, maxFileBytes)
}

// readBounded reads at most maxFileBytes+1 bytes of a file on a pseudo
// file system.
func (t *Set) readBounded(ctx context.Context, p string) ([]byte, error) {
	out := newHeadTail(2*maxFileBytes + 4) // the head half holds it all
	stderr := newHeadTail(4 << 10)
	cmd := t.sb.Command(ctx, "head", "-c", strconv.Itoa(maxFileBytes+1), p)
	cmd.Stdout, cmd.Stderr = out, stderr
	if err := cmd.Run(); err != nil {
		if msg := strings.TrimSpace(stderr.text()); msg != "" && !isInfra(ctx, err) {
			return nil, &fs.PathError{Op: "read", Path: p, Err: errors.New(msg)}
		}
		return nil, err
	}
	return []byte(out.text()), nil
}

func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a directory"
	}
	return "not a regular file"
}

// stat stats p for the editor; a nil FileInfo comes with a message or an
// error.
func (t *Set) stat(ctx context.Context, p string) (fs.FileInfo, string, error) {
	fi, err := t.sb.Stat(ctx, p)
	if err != nil {
		msg, err := problem(ctx, err, "access", p)
		return nil, msg, err
	}
	return fi, "", nil
}

// file reads the existing text file p for an edit.
func (t *Set) file(ctx context.Context, p, command string) (text string, mode fs.FileMode, msg string, err error) {
	fi, msg, err := t.stat(ctx, p)
	if fi == nil {
		return "", 0, msg, err
	}
	if fi.IsDir() {
		return "", 0, fmt.Sprintf("Error: The path %s is a directory; %s needs a file.", p, command), nil
	}
	text, msg, err = t.readText(ctx, p, fi)
	return text, fi.Mode().Perm(), msg, err
}

func (t *Set) view(ctx context.Context, c editorCall) (string, error) {
	fi, msg, err := t.stat(ctx, c.path)
	if fi == nil {
		return msg, err
	}
	if fi.IsDir() {
		if c.viewRange != nil {
			return "Error: view_range cannot be used when path is a directory.", nil
		}
		return t.listDir(ctx, c.path)
	}
	text, msg, err := t.readText(ctx, c.path, fi)
	if msg != "" || err != nil {
		return msg, err
	}
	lines := splitLines(text)
	from, to := 1, len(lines)
	if r := c.viewRange; r != nil && len(lines) > 0 {
		if r[0] > len(lines) {
			return fmt.Sprintf("Error: Invalid view_range [%d, %d]: %s has %d lines, so start must be between 1 and %d.",
				r[0], r[1], c.path, len(lines), len(lines)), nil
		}
		from = r[0]
		if r[1] != -1 && r[1] < to {
			to = r[1]
		}
	}
	return showFile(c.path, lines, from, to), nil
}

// showFile renders lines from..to of the file p, at most one view's worth,
// with a note on paging when it stops early.
func showFile(p string, lines []string, from, to int) string {
	head := fmt.Sprintf("Here's the result of running `cat -n` on %s:\n", p)
	if len(lines) == 0 {
		return head + "(the file is empty)\n"
	}
	body, last := numbered(lines, from, to, viewMaxBytes, viewMaxLines)
	if last < to {
		next := min(to, 2*last-from+1)
		body += fmt.Sprintf("[Showing lines %d-%d of %d: one view shows at most %d lines and %d bytes. Use view_range to see more, e.g. [%d, %d].]\n",
			from, last, len(lines), viewMaxLines, viewMaxBytes, last+1, next)
	}
	return head + body
}

// listDir lists the directory p two levels deep, hidden entries left out.
func (t *Set) listDir(ctx context.Context, p string) (string, error) {
	ents, err := t.sb.ReadDir(ctx, p)
	if err != nil {
		return problem(ctx, err, "list", p)
	}
	type node struct {
		path  string
		isDir bool
		sub   []fs.DirEntry
		err   error
	}
	var top []*node
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		top = append(top, &node{path: path.Join(p, e.Name()), isDir: e.IsDir()})
	}
	sem := make(chan struct{}, listConcurrency)
	var wg sync.WaitGroup
	for _, n := range top {
		if !n.isDir {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			n.sub, n.err = t.sb.ReadDir(ctx, n.path)
		}()
	}
	wg.Wait()

	var b strings.Builder
	fmt.Fprintf(&b, "Here's the files and directories up to 2 levels deep in %s, excluding hidden items:\n", p)
	b.WriteString(dirName(p, true) + "\n")
	listed, more := 0, 0
	add := func(name string, isDir bool, extra string) {
		if listed >= maxDirEntries {
			more++
			return
		}
		listed++
		b.WriteString(dirName(name, isDir) + extra + "\n")
	}
	for _, n := range top {
		if n.err != nil {
			if isInfra(ctx, n.err) {
				return "", fmt.Errorf("tools: list %s: %w", n.path, n.err)
			}
			var pe *fs.PathError
			reason := n.err
			if errors.As(n.err, &pe) {
				reason = pe.Err
			}
			add(n.path, true, fmt.Sprintf(" (cannot list: %v)", reason))
			continue
		}
		add(n.path, n.isDir, "")
		for _, e := range n.sub {
			if !strings.HasPrefix(e.Name(), ".") {
				add(path.Join(n.path, e.Name()), e.IsDir(), "")
			}
		}
	}
	if more > 0 {
		fmt.Fprintf(&b, "[... %d more entries not shown. Use execute_bash (ls, find) to look further.]\n", more)
	}
	return b.String(), nil
}

// dirName marks directories with a trailing slash.
func dirName(p string, isDir bool) string {
	if isDir && !strings.HasSuffix(p, "/") {
		return p + "/"
	}
	return p
}

func (t *Set) create(ctx context.Context, c editorCall) (string, error) {
	p := c.path
	prev := version{mode: 0o644}
	fi, err := t.sb.Stat(ctx, p)
	switch {
	case err == nil && fi.IsDir():
		return fmt.Sprintf("Error: The path %s is a directory; create needs a file path.", p), nil
	case err == nil && !fi.Mode().IsRegular():
		return fmt.Sprintf("Error: %s exists and is %s; create only replaces regular files.", p, fileKind(fi.Mode())), nil
	case err == nil && fi.Size() > maxFileBytes:
		return fmt.Sprintf("Error: %s already exists and is too large (%d bytes) to be replaced by create; remove it first with execute_bash.", p, fi.Size()), nil
	case err == nil:
		data, err := t.sb.ReadFile(ctx, p)
		if err != nil {
			return problem(ctx, err, "read", p)
		}
		prev = version{data: data, mode: fi.Mode().Perm(), existed: true}
	case errors.Is(err, fs.ErrNotExist) && !isInfra(ctx, err):
		if dir := path.Dir(p); dir != "/" {
			if err := t.sb.MkdirAll(ctx, dir, 0o755); err != nil {
				return problem(ctx, err, "create directory", dir)
			}
		}
	default:
		return problem(ctx, err, "access", p)
	}
	if err := t.sb.WriteFile(ctx, p, []byte(*c.fileText), prev.mode); err != nil {
		return problem(ctx, err, "write", p)
	}
	t.remember(p, prev)
	n := len(splitLines(*c.fileText))
	if prev.existed {
		return fmt.Sprintf("File overwritten: %s (%s). Its previous content was replaced; undo_edit brings it back.", p, plural(n, "line")), nil
	}
	return fmt.Sprintf("File created successfully at: %s (%s).", p, plural(n, "line")), nil
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}

func (t *Set) strReplace(ctx context.Context, c editorCall) (string, error) {
	p := c.path
	text, mode, msg, err := t.file(ctx, p, c.command)
	if msg != "" || err != nil {
		return msg, err
	}
	old, repl := *c.oldStr, ""
	if c.newStr != nil {
		repl = *c.newStr
	}
	var at []int // lines where old starts
	first := -1
	line, scanned := 1, 0
	for i := 0; ; {
		j := strings.Index(text[i:], old)
		if j < 0 {
			break
		}
		j += i
		line += strings.Count(text[scanned:j], "\n")
		scanned = j
		at = append(at, line)
		if first < 0 {
			first = j
		}
		i = j + len(old)
	}
	switch {
	case len(at) == 0:
		msg := fmt.Sprintf("Error: No replacement was performed: old_str did not appear verbatim in %s.", p)
		if strings.Contains(text, "\r\n") && !strings.Contains(old, "\r\n") && strings.Contains(old, "\n") {
			msg += " Note: the file has Windows line endings (\\r\\n)."
		}
		return msg + " View the file to copy the exact text, whitespace and indentation included.", nil
	case len(at) > 1:
		return fmt.Sprintf("Error: No replacement was performed: old_str has %d occurrences in %s, in lines %s — make old_str unique by including more of the surrounding lines.",
			len(at), p, lineList(at)), nil
	case old == repl:
		return "Error: old_str and new_str are the same, so there is nothing to replace.", nil
	}
	updated := text[:first] + repl + text[first+len(old):]
	if err := t.sb.WriteFile(ctx, p, []byte(updated), mode); err != nil {
		return problem(ctx, err, "write", p)
	}
	t.remember(p, version{data: []byte(text), mode: mode, existed: true})
	start := at[0]
	end := start + strings.Count(repl, "\n")
	if strings.HasSuffix(repl, "\n") && end > start {
		end-- // the replacement ends at a line break
	}
	return edited(p, updated, start, end, ""), nil
}

// lineList names occurrence lines: "3, 7, 12" or "3, 7, ... (40 in all)".
func lineList(at []int) string {
	var parts []string
	for i, n := range at {
		if i == maxListedLines {
			return strings.Join(parts, ", ") + fmt.Sprintf(", ... (%d in all)", len(at))
		}
		parts = append(parts, strconv.Itoa(n))
	}
	return strings.Join(parts, ", ")
}

// edited is the message after an edit: lines start..end of the new text
// with context around them.
func edited(p, text string, start, end int, advice string) string {
	lines := splitLines(text)
	var b strings.Builder
	fmt.Fprintf(&b, "The file %s has been edited. ", p)
	if len(lines) == 0 {
		b.WriteString("It is now empty.\n")
	} else {
		from := max(1, start-snippetContext)
		to := min(len(lines), end+snippetContext)
		from = min(from, to)
		fmt.Fprintf(&b, "Here's the result of running `cat -n` on a snippet of %s:\n", p)
		body, last := numbered(lines, from, to, viewMaxBytes, viewMaxLines)
		b.WriteString(body)
		if last < to {
			fmt.Fprintf(&b, "[Snippet cut at line %d; view the file to see the rest of the edit.]\n", last)
		}
	}
	b.WriteString("Review the changes and make sure they are as expected")
	b.WriteString(advice)
	b.WriteString(". Edit the file again if necessary.")
	return b.String()
}

func (t *Set) insert(ctx context.Context, c editorCall) (string, error) {
	p := c.path
	text, mode, msg, err := t.file(ctx, p, c.command)
	if msg != "" || err != nil {
		return msg, err
	}
	n := len(splitLines(text))
	at := *c.insertLine
	if at > n {
		return fmt.Sprintf("Error: Invalid insert_line %d: it must be between 0 and %d, the number of lines in %s.", at, n, p), nil
	}
	// Find the byte offset after line at.
	off := 0
	for i := 0; i < at; i++ {
		j := strings.IndexByte(text[off:], '\n')
		if j < 0 {
			off = len(text)
			break
		}
		off += j + 1
	}
	before, after := text[:off], text[off:]
	if before != "" && !strings.HasSuffix(before, "\n") {
		before += "\n"
	}
	ins := *c.newStr
	if !strings.HasSuffix(ins, "\n") {
		ins += "\n"
	}
	updated := before + ins + after
	if err := t.sb.WriteFile(ctx, p, []byte(updated), mode); err != nil {
		return problem(ctx, err, "write", p)
	}
	t.remember(p, version{data: []byte(text), mode: mode, existed: true})
	return edited(p, updated, at+1, at+strings.Count(ins, "\n"), " (correct indentation, no duplicated lines)"), nil
}

func (t *Set) undo(ctx context.Context, c editorCall) (string, error) {
	p := c.path
	v, ok := t.recall(p)
	if !ok {
		return fmt.Sprintf("Error: No edit history for %s: undo_edit reverts the last create, str_replace or insert made on it with this tool.", p), nil
	}
	if !v.existed {
		if err := t.sb.Remove(ctx, p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.remember(p, v)
			return problem(ctx, err, "remove", p)
		}
		return fmt.Sprintf("Last edit to %s undone: the file did not exist before it was created, so it was removed.", p), nil
	}
	if err := t.sb.WriteFile(ctx, p, v.data, v.mode); err != nil {
		t.remember(p, v)
		return problem(ctx, err, "write", p)
	}
	msg := fmt.Sprintf("Last edit to %s undone. ", p)
	if isBinary(v.data) {
		return msg + fmt.Sprintf("It is a binary file of %d bytes again.", len(v.data)), nil
	}
	lines := splitLines(string(v.data))
	return msg + showFile(p, lines, 1, len(lines)), nil
}

// remember pushes the content of p before an edit onto its undo history,
// keeping at most maxUndo versions per path and maxHistoryBytes in all
// (the oldest versions of any path go first).
func (t *Set) remember(p string, v version) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seq++
	v.seq = t.seq
	h := append(t.history[p], v)
	t.histBytes += len(v.data)
	if len(h) > maxUndo {
		t.histBytes -= len(h[0].data)
		h = h[1:]
	}
	t.history[p] = h
	for t.histBytes > maxHistoryBytes {
		oldest := ""
		for q, hq := range t.history {
			if len(hq) > 0 && (oldest == "" || hq[0].seq < t.history[oldest][0].seq) && hq[0].seq != v.seq {
				oldest = q
			}
		}
		if oldest == "" {
			break
		}
		t.histBytes -= len(t.history[oldest][0].data)
		t.history[oldest] = t.history[oldest][1:]
		if len(t.history[oldest]) == 0 {
			delete(t.history, oldest)
		}
	}
}

// recall pops the last version of p from its undo history.
func (t *Set) recall(p string) (version, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.history[p]
	if len(h) == 0 {
		return version{}, false
	}
	v := h[len(h)-1]
	if len(h) == 1 {
		delete(t.history, p)
	} else {
		t.history[p] = h[:len(h)-1]
	}
	t.histBytes -= len(v.data)
	return v, true
}
