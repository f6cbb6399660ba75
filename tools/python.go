package tools

import (
	"bytes"
	"context"
	"fmt"
	"image"
	_ "image/jpeg" // DecodeConfig of displayed JPEGs
	_ "image/png"  // DecodeConfig of figures
	"path"
	"strings"

	"github.com/agentsandbox/sandbox"
)

// figuresDir is where the python tool saves images, in the working
// directory.
const figuresDir = "figures"

// python runs a python call in the Set's interpreter, starting it first.
func (t *Set) python(ctx context.Context, c pythonCall) (Result, error) {
	t.pyMu.Lock()
	defer t.pyMu.Unlock()
	if t.py == nil {
		py, err := t.sb.Interpreter(ctx, "python")
		if err != nil {
			if isInfra(ctx, err) {
				return Result{}, fmt.Errorf("tools: %s: %w", Python, err)
			}
			return Result{Text: fmt.Sprintf("Error: Python cannot run in this sandbox (%v). Use %s instead.", err, ExecuteBash)}, nil
		}
		t.py = py
	}
	runCtx, _, cancel := t.callContext(ctx, c.timeout)
	defer cancel()
	ex, err := t.py.Run(runCtx, c.code)
	if ex == nil {
		return Result{}, fmt.Errorf("tools: %s: %w", Python, err)
	}
	res, serr := t.renderExecution(ctx, ex)
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	if err == nil && serr != nil && isInfra(ctx, serr) {
		err = serr
	}
	if err != nil {
		return res, fmt.Errorf("tools: %s: %w", Python, err)
	}
	return res, nil
}

// renderExecution formats a run for the model and saves its images:
//
//	[stdout]
//	...
//	[stderr]
//	...
//	[output]
//	<the text/plain of each value and display>
//	[image] /workspace/figures/figure-1.png (640x480 image/png)
//	[error]
//	Traceback ...
//	note: ...
func (t *Set) renderExecution(ctx context.Context, ex *sandbox.Execution) (Result, error) {
	var res Result
	var b strings.Builder
	section := func(name, text string) {
		if text == "" {
			return
		}
		fmt.Fprintf(&b, "[%s]\n%s", name, text)
		if !strings.HasSuffix(text, "\n") {
			b.WriteByte('\n')
		}
	}
	bounded := func(s string) string {
		h := newHeadTail(t.outLimit)
		h.Write([]byte(s))
		return h.text()
	}
	section("stdout", bounded(ex.Stdout))
	section("stderr", bounded(ex.Stderr))
	var texts []string
	var saveErr error
	for _, o := range ex.Outputs {
		switch o.MIME {
		case "text/plain":
			texts = append(texts, bounded(string(o.Data)))
		case "image/png", "image/jpeg":
			img, err := t.saveImage(ctx, o)
			if err != nil {
				saveErr = err
				texts = append(texts, fmt.Sprintf("[an %s image that could not be saved: %v]", o.MIME, err))
				continue
			}
			res.Images = append(res.Images, img)
			desc := o.MIME
			if cfg, _, err := image.DecodeConfig(bytes.NewReader(o.Data)); err == nil {
				desc = fmt.Sprintf("%dx%d %s", cfg.Width, cfg.Height, o.MIME)
			}
			texts = append(texts, fmt.Sprintf("[image] %s (%s)", img.Path, desc))
		}
	}
	section("output", strings.Join(texts, "\n"))
	if e := ex.Error; e != nil {
		text := e.Traceback
		if text == "" {
			text = e.Error()
		}
		section("error", bounded(text))
	}
	var notes []string
	if ex.TimedOut && !ex.StateLost {
		notes = append(notes, "the code was interrupted at its timeout; the session and its variables are kept")
	}
	if ex.StateLost {
		notes = append(notes, "the Python session ended (killed at the timeout, out of memory, or exited) and will start anew: variables, imports and loaded data from earlier calls are gone")
	}
	if ex.Truncated {
		notes = append(notes, "some output was dropped (over the sandbox's output limit)")
	}
	for _, n := range notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	if b.Len() == 0 {
		b.WriteString("(no output)\n")
	}
	res.Text = strings.ToValidUTF8(b.String(), "\uFFFD")
	return res, saveErr
}

// saveImage writes an image output into the figures directory.
func (t *Set) saveImage(ctx context.Context, o sandbox.Output) (Image, error) {
	wd := t.lookupWorkdir(ctx)
	if wd == "" {
		wd = "/workspace"
	}
	dir := path.Join(wd, figuresDir)
	if err := t.sb.MkdirAll(ctx, dir, 0o755); err != nil {
		return Image{}, err
	}
	ext := ".png"
	if o.MIME == "image/jpeg" {
		ext = ".jpg"
	}
	t.mu.Lock()
	t.figures++
	name := path.Join(dir, fmt.Sprintf("figure-%d%s", t.figures, ext))
	t.mu.Unlock()
	if err := t.sb.WriteFile(ctx, name, o.Data, 0o644); err != nil {
		return Image{}, err
	}
	return Image{MIME: o.MIME, Data: o.Data, Path: name}, nil
}
