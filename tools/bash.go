package tools

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agentsandbox/sandbox"
)

// bash runs an execute_bash call. The output is streamed into bounded
// buffers that keep the start and the end of each stream, so a traceback
// printed after megabytes of output still reaches the model.
func (t *Set) bash(ctx context.Context, c bashCall) (string, error) {
	runCtx, timeout, cancel := t.callContext(ctx, c.timeout)
	defer cancel()
	stdout, stderr := newHeadTail(t.outLimit), newHeadTail(t.outLimit)
	cmd := t.sb.Command(runCtx, "/bin/sh", "-c", c.command)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	start := time.Now()
	err := cmd.Run()
	elapsed := time.Since(start)

	var ee *sandbox.ExitError
	var code int
	var note string
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.Code
		killed := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
		switch {
		case killed && ctx.Err() != nil:
			// The caller's context ended: not the model's doing.
			return render(code, "the command was killed because the episode was cancelled", stdout, stderr),
				fmt.Errorf("tools: %s: %w", ExecuteBash, ctx.Err())
		case killed:
			d := elapsed.Round(time.Second)
			if timeout > 0 && elapsed >= timeout-50*time.Millisecond {
				d = timeout
			}
			note = fmt.Sprintf("the command timed out after %s and was killed, with every process it started", seconds(d))
		case ee.OOMKilled:
			note = "the command was killed by the out-of-memory killer: the sandbox ran out of memory"
		}
	default:
		return "", fmt.Errorf("tools: %s: %w", ExecuteBash, err)
	}
	text := render(code, note, stdout, stderr)
	if t.actSummary {
		text += summarize(cmd.Activity())
	}
	return text, nil
}

// callContext bounds a call by its timeout, or the Set's default when it
// gives none (0), and returns the timeout that applies (0: none).
func (t *Set) callContext(ctx context.Context, timeout time.Duration) (context.Context, time.Duration, context.CancelFunc) {
	if timeout == 0 {
		timeout = t.defTimeout
	}
	if timeout <= 0 {
		return ctx, 0, func() {}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	return ctx, timeout, cancel
}

// seconds formats d in seconds: "2s", "0.5s".
func seconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
}

// render formats a command's outcome for the model:
//
//	exit code: 1
//	note: ...            (timeout, out of memory)
//	[stdout]
//	...
//	[stderr]
//	...
//
// Empty streams are left out; with no output at all it says "(no output)".
func render(code int, note string, stdout, stderr *headTail) string {
	var b strings.Builder
	fmt.Fprintf(&b, "exit code: %d\n", code)
	if note != "" {
		fmt.Fprintf(&b, "note: %s\n", note)
	}
	out, errs := stdout.text(), stderr.text()
	for _, s := range []struct{ name, text string }{{"stdout", out}, {"stderr", errs}} {
		if s.text == "" {
			continue
		}
		fmt.Fprintf(&b, "[%s]\n%s", s.name, s.text)
		if !strings.HasSuffix(s.text, "\n") {
			b.WriteByte('\n')
		}
	}
	if out == "" && errs == "" {
		b.WriteString("(no output)\n")
	}
	return strings.ToValidUTF8(b.String(), "\uFFFD")
}
