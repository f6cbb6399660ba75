package tools_test

import (
	"bytes"
	"image/png"
	"strings"
	"testing"

	"github.com/agentsandbox/sandbox/tools"
)

// TestPython: the python tool keeps state between calls, shows values,
// errors and figures (saved in the workdir and returned as images), and
// explains timeouts.
func TestPython(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t, pythonImage)
	set := tools.New(sb)
	defer set.Close()
	ctx := testCtx(t)

	out := call(t, set, tools.Python, `{"code": "import pandas as pd\ndf = pd.DataFrame({'units': [3, 5]})\nprint('loaded', len(df))"}`)
	if out != "[stdout]\nloaded 2\n" {
		t.Errorf("first call: %q", out)
	}
	// The variable from the first call is still there.
	out = call(t, set, tools.Python, `{"code": "df['units'].sum()"}`)
	if !strings.Contains(out, "[output]\n") || !strings.HasSuffix(out, "8\n") {
		t.Errorf("value: %q", out)
	}
	out = call(t, set, tools.Python, `{"code": "df['revenue']"}`)
	if !strings.Contains(out, "[error]\nTraceback") || !strings.Contains(out, "KeyError: 'revenue'") {
		t.Errorf("error: %q", out)
	}

	res, err := set.CallResult(ctx, tools.Python, `{"code": "import matplotlib.pyplot as plt\nplt.figure(figsize=(3, 2), dpi=50)\nplt.plot(df['units'])"}`)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Images) != 1 || res.Images[0].Path != "/workspace/figures/figure-1.png" ||
		!strings.Contains(res.Text, "[image] /workspace/figures/figure-1.png (150x100 image/png)") {
		t.Fatalf("figure: %q, %d images", res.Text, len(res.Images))
	}
	saved, err := sb.ReadFile(ctx, res.Images[0].Path)
	if err != nil || !bytes.Equal(saved, res.Images[0].Data) {
		t.Fatalf("saved figure: %d bytes, %v", len(saved), err)
	}
	if _, err := png.Decode(bytes.NewReader(saved)); err != nil {
		t.Errorf("saved figure is not a PNG: %v", err)
	}

	out = call(t, set, tools.Python, `{"code": "import time\nkeep = 1\ntime.sleep(30)", "timeout": 1}`)
	if !strings.Contains(out, "KeyboardInterrupt") || !strings.Contains(out, "note: the code was interrupted at its timeout; the session and its variables are kept") {
		t.Errorf("timeout: %q", out)
	}
	if out := call(t, set, tools.Python, `{"code": "keep + 1"}`); !strings.HasSuffix(out, "2\n") {
		t.Errorf("after the timeout: %q", out)
	}
	for _, args := range []string{`{}`, `{"code": "  "}`, `{"code": 3}`, `{"code": "1", "timeout": -1}`, `{"code": "1", "extra": 1}`} {
		if out := call(t, set, tools.Python, args); !strings.HasPrefix(out, "Error: ") {
			t.Errorf("%s: %q, want an Error: message", args, out)
		}
	}

	// No python in busybox: a message that says what to use instead.
	bb := tools.New(newSandbox(t, busyboxImage))
	if out := call(t, bb, tools.Python, `{"code": "1"}`); !strings.HasPrefix(out, "Error: Python cannot run") || !strings.Contains(out, tools.ExecuteBash) {
		t.Errorf("python in busybox: %q", out)
	}
}
