package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"image/png"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/internal/testenv"
)

// newInterp starts an interpreter closed at the end of the test.
func newInterp(t *testing.T, sb *sandbox.Sandbox, lang string) *sandbox.Interpreter {
	t.Helper()
	in, err := sb.Interpreter(testCtx(t), lang)
	if err != nil {
		t.Fatalf("Interpreter(%q): %v", lang, err)
	}
	t.Cleanup(func() { in.Close() })
	return in
}

// run runs code and fails the test on an error (not on a CodeError).
func run(t *testing.T, in *sandbox.Interpreter, code string) *sandbox.Execution {
	t.Helper()
	ex, err := in.Run(testCtx(t), code)
	if err != nil {
		t.Fatalf("Run(%q): %v", code, err)
	}
	return ex
}

// plain returns the text/plain output of ex, failing if there is not
// exactly one.
func plain(t *testing.T, ex *sandbox.Execution) string {
	t.Helper()
	var out []string
	for _, o := range ex.Outputs {
		if o.MIME == "text/plain" {
			out = append(out, string(o.Data))
		}
	}
	if len(out) != 1 {
		t.Fatalf("text/plain outputs %q (error %v, stderr %q); want one", out, ex.Error, ex.Stderr)
	}
	return out[0]
}

func TestInterpreterPython(t *testing.T) {
	t.Parallel()
	sb := newPython(t)
	py := newInterp(t, sb, "python")

	t.Run("state", func(t *testing.T) {
		ex := run(t, py, "x = 41\nimport os\nos.chdir('/tmp')\ndef twice(v):\n    return 2 * v\nprint('set')")
		if ex.Error != nil || ex.Stdout != "set\n" || len(ex.Outputs) != 0 {
			t.Fatalf("first run: %+v", ex)
		}
		if got := plain(t, run(t, py, "x + 1")); got != "42" {
			t.Errorf("x + 1 = %q", got)
		}
		if got := plain(t, run(t, py, "(os.getcwd(), twice(x))")); got != "('/tmp', 82)" {
			t.Errorf("cwd and function: %q", got)
		}
		// Nothing for a trailing None or a statement.
		if ex := run(t, py, "y = None\ny"); len(ex.Outputs) != 0 {
			t.Errorf("trailing None gave %+v", ex.Outputs)
		}
		// Another interpreter is another process.
		other := newInterp(t, sb, "python")
		ex = run(t, other, "x")
		if ex.Error == nil || ex.Error.Name != "NameError" {
			t.Errorf("x in a second interpreter: %+v", ex.Error)
		}
		if got := plain(t, run(t, other, "import os; os.getcwd()")); got != "'/workspace'" {
			t.Errorf("cwd of the second interpreter: %s", got)
		}
	})

	t.Run("error", func(t *testing.T) {
		ex := run(t, py, "sales = {'units': 3}\n\nprint('before')\nsales['revenue']\n")
		e := ex.Error
		if e == nil || e.Name != "KeyError" || e.Value != "'revenue'" {
			t.Fatalf("error: %+v", e)
		}
		if ex.Stdout != "before\n" {
			t.Errorf("stdout before the error: %q", ex.Stdout)
		}
		if !strings.Contains(e.Traceback, ", line 4") || !strings.Contains(e.Traceback, "sales['revenue']") ||
			!strings.HasSuffix(e.Traceback, "KeyError: 'revenue'\n") {
			t.Errorf("traceback lacks the cell's line 4:\n%s", e.Traceback)
		}
		if strings.Contains(e.Traceback, "<string>") || strings.Contains(e.Traceback, "_run") {
			t.Errorf("traceback shows the driver's frames:\n%s", e.Traceback)
		}
		// An error inside a function from an earlier cell names both.
		run(t, py, "def bad():\n    return 1 / 0")
		ex = run(t, py, "bad()")
		if ex.Error == nil || ex.Error.Name != "ZeroDivisionError" || strings.Count(ex.Error.Traceback, "<cell") != 2 {
			t.Errorf("error in a function of an earlier cell: %+v", ex.Error)
		}
		ex = run(t, py, "def broken(:\n  pass")
		if ex.Error == nil || ex.Error.Name != "SyntaxError" || !strings.Contains(ex.Error.Traceback, "line 1") {
			t.Errorf("syntax error: %+v", ex.Error)
		}
		ex = run(t, py, "input('name? ')")
		if ex.Error == nil || ex.Error.Name != "EOFError" {
			t.Errorf("input(): %+v; want EOFError", ex.Error)
		}
		ex = run(t, py, "import sys; sys.exit(3)")
		if ex.Error == nil || ex.Error.Name != "SystemExit" || ex.StateLost {
			t.Errorf("sys.exit: %+v (state lost %v)", ex.Error, ex.StateLost)
		}
		if got := plain(t, run(t, py, "x")); got != "41" {
			t.Errorf("x after the errors: %q", got)
		}
	})

	t.Run("rich", func(t *testing.T) {
		ex := run(t, py, "import pandas as pd\ndf = pd.DataFrame({'city': ['Oslo', 'Lima'], 'sales': [3, 5]})\ndf")
		if ex.Error != nil || len(ex.Outputs) != 2 || ex.Outputs[0].MIME != "text/html" || ex.Outputs[1].MIME != "text/plain" {
			t.Fatalf("DataFrame outputs: %+v, %v", ex.Outputs, ex.Error)
		}
		if html := string(ex.Outputs[0].Data); !strings.Contains(html, "<table") || !strings.Contains(html, "Lima") {
			t.Errorf("DataFrame HTML: %s", html)
		}
		// Figures become PNGs: one shown mid-run, one left open.
		ex = run(t, py, `import matplotlib.pyplot as plt
plt.figure(figsize=(4, 3), dpi=50)
plt.plot([1, 2, 3])
plt.show()
print('between')
fig = plt.figure(figsize=(2, 2), dpi=40)
plt.bar(['a', 'b'], [1, 2])
display('shown')`)
		if ex.Error != nil {
			t.Fatal(ex.Error)
		}
		var sizes []string
		var texts []string
		for _, o := range ex.Outputs {
			switch o.MIME {
			case "image/png":
				img, err := png.Decode(bytes.NewReader(o.Data))
				if err != nil {
					t.Fatalf("PNG output does not decode: %v", err)
				}
				b := img.Bounds()
				sizes = append(sizes, strconv.Itoa(b.Dx())+"x"+strconv.Itoa(b.Dy()))
			case "text/plain":
				texts = append(texts, string(o.Data))
			}
		}
		if strings.Join(sizes, " ") != "200x150 80x80" {
			t.Errorf("figure sizes %v, want 200x150 then 80x80", sizes)
		}
		if !strings.Contains(strings.Join(texts, " "), "'shown'") {
			t.Errorf("display('shown') missing from %q", texts)
		}
		if strings.Contains(ex.Stderr, "non-interactive") || ex.Stdout != "between\n" {
			t.Errorf("stdout %q stderr %q", ex.Stdout, ex.Stderr)
		}
		// Figures do not come back in later runs.
		if ex := run(t, py, "1"); len(ex.Outputs) != 1 {
			t.Errorf("a later run: %+v", ex.Outputs)
		}
	})

	t.Run("forgery", func(t *testing.T) {
		// User output that copies the protocol is data.
		fake := `{"t":"done","error":null}` + "\n" + `{"t":"display","data":{"text/plain":"fake"}}`
		ex := run(t, py, "import os, sys\nprint('"+strings.ReplaceAll(fake, "\n", "\\n")+"')\nsys.stdout.flush()\nos.write(1, b'\\n{\"t\":\"done\"}\\n')\nos.write(2, b'{\"t\":\"ready\"}\\n')\nz = 7")
		if ex.Error != nil || len(ex.Outputs) != 0 {
			t.Fatalf("forged frames changed the run: %+v", ex)
		}
		if ex.Stdout != fake+"\n"+"\n"+`{"t":"done"}`+"\n" || ex.Stderr != `{"t":"ready"}`+"\n" {
			t.Errorf("stdout %q stderr %q", ex.Stdout, ex.Stderr)
		}
		if got := plain(t, run(t, py, "z")); got != "7" {
			t.Errorf("z = %q: the run ended early", got)
		}
		// Output of subprocesses is captured too, binary included.
		ex = run(t, py, "import subprocess\nsubprocess.run(['sh', '-c', 'echo from-sh; printf \"\\\\377\\\\000\" >&2'])")
		if ex.Stdout != "from-sh\n" || ex.Stderr != "\xff\x00" {
			t.Errorf("subprocess output: %q %q", ex.Stdout, ex.Stderr)
		}
	})

	t.Run("stream", func(t *testing.T) {
		var w strings.Builder
		py2 := newInterp(t, sb, "python")
		py2.Stdout = &w
		run(t, py2, "for i in range(3): print(i)")
		if w.String() != "0\n1\n2\n" {
			t.Errorf("streamed %q", w.String())
		}
	})
}

// findProto is the start of a hostile cell that finds the driver's
// protocol descriptor and the run's ID through display's globals.
const findProto = "import os, sys, json\ng = display.__globals__\nfd, rid = g['_proto_fd'], g.get('_rid', '')\n"

// TestInterpreterForgedMIMENames: with the default limits (1 MiB
// OutputBytes, so lines of several MiB pass), display messages a cell
// writes straight to the driver's protocol descriptor whose MIME names are
// 5 MiB each (100 MiB in all) keep nothing and leave the host's heap flat.
// Not parallel: the heap is the process's, and parallel tests' sandboxes
// would be counted in it (they wait while a serial test runs).
func TestInterpreterForgedMIMENames(t *testing.T) {
	sb := newPython(t)
	py := newInterp(t, sb, "python")
	heap0 := heapNow()
	ex := run(t, py, findProto+`line = ('{"t":"display","id":"%s","data":{"%s":""}}\n' % (rid, 'x' * (5 << 20))).encode()
for i in range(20):
    os.write(fd, line)
'end'`)
	grew := heapNow() - heap0
	if got := plain(t, ex); got != "'end'" || len(ex.Outputs) != 1 || !ex.Truncated {
		t.Errorf("100 MiB of MIME names: %d outputs, truncated %v", len(ex.Outputs), ex.Truncated)
	}
	kept := len(ex.Stdout) + len(ex.Stderr)
	for _, o := range ex.Outputs {
		kept += len(o.MIME) + len(o.Data)
	}
	t.Logf("100 MiB of MIME names: %d outputs, %d bytes kept, host heap %+.1f MiB", len(ex.Outputs), kept, float64(grew)/(1<<20))
	if kept > 4<<10 {
		t.Errorf("the Execution keeps %d bytes", kept)
	}
	if grew > 32<<20 {
		t.Errorf("host heap grew by %d MiB", grew>>20)
	}
}

// TestInterpreterForgedMessages: code in a cell writes messages straight to
// the driver's protocol descriptor (found through display's globals, as a
// hostile cell would). Thousands of tiny displays keep at most 1000
// outputs; a forged "done" without the run's ID changes nothing; and one
// with the ID (read from the driver's frames: code in the driver's process
// can lie about its own run) ends only that run: the next Run gets its own
// result, not the shifted one.
func TestInterpreterForgedMessages(t *testing.T) {
	t.Parallel()
	sb := newPython(t)
	py := newInterp(t, sb, "python")

	t.Run("count", func(t *testing.T) {
		ex := run(t, py, findProto+`line = ('{"t":"display","id":"%s","data":{"a/b":""}}\n' % rid).encode()
os.write(fd, line * 5000)`)
		if len(ex.Outputs) != 1000 || !ex.Truncated {
			t.Errorf("5000 displays: %d outputs kept, truncated %v; want 1000, true", len(ex.Outputs), ex.Truncated)
		}
	})

	t.Run("done", func(t *testing.T) {
		ex := run(t, py, findProto+`os.write(fd, b'{"t":"done","error":null}\n{"t":"done","id":"x","error":null}\n')
import time
time.sleep(0.5)
raise ValueError("real")`)
		if ex.Error == nil || ex.Error.Name != "ValueError" || ex.Error.Value != "real" {
			t.Fatalf("forged done without the run's ID: %+v", ex.Error)
		}
		ex = run(t, py, findProto+`os.write(fd, ('{"t":"done","id":"%s","error":null}\n' % rid).encode())
import time
time.sleep(1)
raise ValueError("late")`)
		if ex.Error != nil {
			t.Logf("a forged done with the ID was not taken: %+v", ex.Error)
		}
		for i := range 3 {
			ex = run(t, py, strconv.Itoa(i)+" * 7")
			if ex.Error != nil || plain(t, ex) != strconv.Itoa(i*7) {
				t.Fatalf("run %d after the forged done: %+v, %+v; want its own value", i, ex.Error, ex.Outputs)
			}
		}
	})
}

// TestInterpreterHostile: timeouts keep state when the code stops at the
// interrupt; code that ignores it is killed with its children and the
// interpreter restarts; memory bombs and output floods are bounded.
func TestInterpreterHostile(t *testing.T) {
	t.Parallel()
	sb := newPython(t, sandbox.WithLimits(sandbox.Limits{Memory: 256 << 20, OutputBytes: 64 << 10}))
	py := newInterp(t, sb, "python")

	t.Run("interrupt", func(t *testing.T) {
		run(t, py, "import time\nkept = 'yes'")
		ctx, cancel := context.WithTimeout(testCtx(t), time.Second)
		defer cancel()
		start := time.Now()
		ex, err := py.Run(ctx, "print('start', flush=True)\ntime.sleep(60)")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("interrupted after %v", time.Since(start))
		if !ex.TimedOut || ex.StateLost || ex.Error == nil || ex.Error.Name != "KeyboardInterrupt" || ex.Stdout != "start\n" {
			t.Fatalf("interrupted run: %+v %+v", ex, ex.Error)
		}
		if got := plain(t, run(t, py, "kept")); got != "'yes'" {
			t.Errorf("state after the interrupt: %q", got)
		}
	})

	t.Run("ignoresInterrupt", func(t *testing.T) {
		run(t, py, "lost = 1")
		ctx, cancel := context.WithTimeout(testCtx(t), time.Second)
		defer cancel()
		ex, err := py.Run(ctx, `import subprocess, time
child = subprocess.Popen(['sleep', '1000'])
while True:
    try:
        time.sleep(10)
    except KeyboardInterrupt:
        pass`)
		if err != nil {
			t.Fatal(err)
		}
		if !ex.StateLost || !ex.TimedOut || ex.Error == nil || ex.Error.Name != "TimeoutError" {
			t.Fatalf("run ignoring the interrupt: %+v %+v", ex, ex.Error)
		}
		if ps := ftExec(t, sb, "ps -eo args"); strings.Contains(ps, "sleep 1000") || strings.Contains(ps, "agentsandbox") {
			t.Errorf("processes left after the kill:\n%s", ps)
		}
		ex = run(t, py, "lost")
		if ex.Error == nil || ex.Error.Name != "NameError" {
			t.Errorf("state after the restart: %+v", ex.Error)
		}
	})

	t.Run("memoryBomb", func(t *testing.T) {
		ex := run(t, py, "hog = b'x' * (1 << 30)")
		if ex.Error == nil || ex.Error.Name != "MemoryError" {
			t.Fatalf("memory bomb: %+v %+v", ex, ex.Error)
		}
		t.Logf("memory bomb: %v (state lost %v)", ex.Error, ex.StateLost)
		if got := plain(t, run(t, py, "6 * 7")); got != "42" {
			t.Errorf("after the memory bomb: %q", got)
		}
	})

	t.Run("flood", func(t *testing.T) {
		var before runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		ex := run(t, py, "import sys\nfor i in range(300):\n    sys.stdout.write('y' * 100000)\nfor i in range(200):\n    display(list(range(20000)))\n'end'")
		var after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&after)
		total := 0
		for _, o := range ex.Outputs {
			total += len(o.Data)
		}
		if !ex.Truncated || len(ex.Stdout) != 64<<10 || total > 4*64<<10 {
			t.Errorf("flood: truncated %v, stdout %d bytes, outputs %d bytes in %d", ex.Truncated, len(ex.Stdout), total, len(ex.Outputs))
		}
		if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 16<<20 {
			t.Errorf("host heap grew by %d bytes", grew)
		}
		if got := plain(t, run(t, py, "'after'")); got != "'after'" {
			t.Errorf("after the flood: %q", got)
		}
	})

	t.Run("close", func(t *testing.T) {
		in := newInterp(t, sb, "python")
		run(t, in, "import subprocess\np = subprocess.Popen(['sleep', '999'])")
		// Close comes once the run has started: it printed. (A line longer
		// than the 32 bytes the driver holds back while it looks for the
		// end-of-cell token, so that some of it is forwarded at once.)
		started := make(chan struct{})
		in.Stdout = &firstWrite{c: started}
		done := make(chan error, 1)
		go func() {
			_, err := in.Run(testCtx(t), "print('started ' * 16, flush=True)\nimport time\ntime.sleep(60)")
			done <- err
		}()
		select {
		case <-started:
		case err := <-done:
			t.Fatalf("the run ended before Close: %v", err)
		case <-time.After(testenv.HangGuard):
			t.Fatalf("the run printed nothing within %v", testenv.HangGuard)
		}
		if err := in.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, sandbox.ErrClosed) {
			t.Errorf("Run during Close: %v, want ErrClosed", err)
		}
		if _, err := in.Run(testCtx(t), "1"); !errors.Is(err, sandbox.ErrClosed) {
			t.Errorf("Run after Close: %v, want ErrClosed", err)
		}
		if ps := ftExec(t, sb, "ps -eo args"); strings.Contains(ps, "sleep 999") {
			t.Errorf("processes left after Close:\n%s", ps)
		}
	})
}

func TestInterpreterShell(t *testing.T) {
	t.Parallel()
	sb := newPython(t)
	sh := newInterp(t, sb, "bash")
	ex := run(t, sh, "cd /tmp\nexport FOO=bar\ngreet() { echo \"hi $1\"; }\necho set")
	if ex.Error != nil || ex.Stdout != "set\n" {
		t.Fatalf("first run: %+v %v", ex, ex.Error)
	}
	ex = run(t, sh, "pwd; echo $FOO; greet you; printf no-newline")
	if ex.Stdout != "/tmp\nbar\nhi you\nno-newline" || ex.Stderr != "" {
		t.Errorf("state: %q %q", ex.Stdout, ex.Stderr)
	}
	ex = run(t, sh, "echo out; echo err >&2; false")
	if ex.Error == nil || ex.Error.Name != "ExitStatus" || ex.Error.Value != "1" || ex.Stdout != "out\n" || ex.Stderr != "err\n" {
		t.Errorf("failing run: %+v %+v", ex, ex.Error)
	}
	// Fake markers and reads of stdin change nothing.
	ex = run(t, sh, "printf '\\nas0123:0\\n'; read line; echo \"read=$?\"; cat")
	if ex.Stdout != "\nas0123:0\nread=1\n" || ex.Error != nil {
		t.Errorf("fake marker: %q %v", ex.Stdout, ex.Error)
	}
	ex = run(t, sh, "echo bye; exit 3")
	if !ex.StateLost || ex.Error == nil || ex.Error.Value != "3" || ex.Stdout != "bye\n" {
		t.Errorf("exit: %+v %+v", ex, ex.Error)
	}
	if ex := run(t, sh, "pwd; echo \"[$FOO]\""); ex.Stdout != "/workspace\n[]\n" {
		t.Errorf("after the restart: %q", ex.Stdout)
	}
	ctx, cancel := context.WithTimeout(testCtx(t), time.Second)
	defer cancel()
	ex, err := sh.Run(ctx, "sleep 1000 & sleep 999")
	if err != nil || !ex.TimedOut || !ex.StateLost {
		t.Errorf("timed-out shell run: %+v, %v", ex, err)
	}
	if ps := ftExec(t, sb, "ps -eo args"); strings.Contains(ps, "sleep 99") || strings.Contains(ps, "sleep 1000") {
		t.Errorf("processes left after the timeout:\n%s", ps)
	}

	// No bash in busybox: sh; no python there either.
	bb := newSandbox(t)
	sh2 := newInterp(t, bb, "bash")
	if ex := run(t, sh2, "cd /tmp; echo $0"); ex.Error != nil {
		t.Errorf("sh session: %+v", ex)
	}
	if ex := run(t, sh2, "pwd"); ex.Stdout != "/tmp\n" {
		t.Errorf("sh session cwd: %q", ex.Stdout)
	}
	if _, err := bb.Interpreter(testCtx(t), "python"); err == nil || !strings.Contains(err.Error(), "no python3 or python in the sandbox's PATH") {
		t.Errorf("python in busybox: %v", err)
	}
	if _, err := bb.Interpreter(testCtx(t), "cobol"); err == nil {
		t.Errorf("unknown language accepted")
	}
}

// TestInterpreterGVisor: the driver works under gVisor too: state, a
// figure, and an interrupt that keeps state.
func TestInterpreterGVisor(t *testing.T) {
	t.Parallel()
	requireRunsc(t)
	sb := newPython(t, sandbox.WithRuntime("runsc"))
	py := newInterp(t, sb, "python")
	ex := run(t, py, "import time\nimport matplotlib.pyplot as plt\nplt.figure(figsize=(1, 1), dpi=20)\nkept = 21\nkept * 2")
	if ex.Error != nil || len(ex.Outputs) != 3 || ex.Outputs[0].MIME != "text/plain" || string(ex.Outputs[0].Data) != "42" ||
		ex.Outputs[1].MIME != "image/png" {
		t.Fatalf("under runsc: %+v %v", ex.Outputs, ex.Error)
	}
	ctx, cancel := context.WithTimeout(testCtx(t), time.Second)
	defer cancel()
	ex, err := py.Run(ctx, "time.sleep(60)")
	if err != nil || ex.Error == nil || ex.Error.Name != "KeyboardInterrupt" || ex.StateLost {
		t.Fatalf("interrupt under runsc: %+v, %v", ex, err)
	}
	if got := plain(t, run(t, py, "kept")); got != "21" {
		t.Errorf("state after the interrupt: %q", got)
	}
}
