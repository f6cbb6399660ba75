// Command fork prepares an environment once, snapshots it, and forks four
// sandboxes from the snapshot that each try a different way to answer the
// same question at the same time. The first answer wins: the other
// attempts are cancelled and their sandboxes closed at once.
//
//	go run ./fork [-image REF]
//
// The image comes from -image, else SANDBOX_IMAGE, else the project's own
// Debian + Python image, which is built offline first if it is missing.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/images"
)

// prepare writes the data and "installs" a small library into the user's
// site-packages (HOME is the working directory, so it is in the snapshot).
const prepare = `set -e
python3 - <<'EOF'
import random
random.seed(42)
with open("data.txt", "w") as f:
    for _ in range(100001):
        print(random.randrange(1_000_000), file=f)
EOF
site=$(python3 -c 'import site; print(site.getusersitepackages())')
mkdir -p "$site"
cat > "$site/quickstats.py" <<'EOF'
def median_file(name):
    with open(name) as f:
        xs = sorted(int(line) for line in f)
    return xs[len(xs) // 2]
EOF
echo "prepared $(wc -l < data.txt) numbers; installed quickstats into $site"
`

// approaches are the four ways to find the median of data.txt.
var approaches = []struct{ name, script string }{
	{"jq", `jq -s 'sort | .[length/2|floor]' data.txt`}, // not installed: fails
	{"insertion sort", `python3 - <<'EOF'
xs = []
for line in open("data.txt"):
    x = int(line)
    i = len(xs)
    xs.append(x)
    while i > 0 and xs[i-1] > x:  # O(n^2): far too slow to win
        xs[i] = xs[i-1]
        i -= 1
    xs[i] = x
print(xs[len(xs) // 2])
EOF`},
	{"installed quickstats", `python3 -c 'import quickstats; print(quickstats.median_file("data.txt"))'`},
	{"sort | awk", `sort -n data.txt | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'`},
}

func main() {
	image := flag.String("image", "", "image to run (default: $SANDBOX_IMAGE or the project's Python image)")
	flag.Parse()
	log.SetFlags(0)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, *image)
	stop()
	if err != nil {
		log.Fatal(err)
	}
}

// run does the work, so that deferred cleanup runs before the program exits.
func run(ctx context.Context, image string) error {
	ref := image
	if ref == "" {
		var err error
		if ref, err = images.FromEnv(ctx, os.Stderr); err != nil {
			return err
		}
	}
	start := time.Now()
	since := func() string { return fmt.Sprintf("%6.2fs", time.Since(start).Seconds()) }

	// 1. Prepare an environment once.
	src, err := sandbox.New(ctx, sandbox.WithImage(ref),
		sandbox.WithLimits(sandbox.Limits{Memory: 256 << 20, ExecTimeout: time.Minute}))
	if err != nil {
		return err
	}
	defer src.Close()
	r, err := src.Exec(ctx, prepare)
	if err != nil {
		return err
	}
	if r.ExitCode != 0 {
		return fmt.Errorf("prepare failed (exit %d): %s", r.ExitCode, r.Stderr)
	}
	fmt.Printf("%s source %.12s: %s", since(), src.ID(), r.Stdout)

	// 2. Snapshot it. The source is not needed any more.
	snap, err := src.Snapshot(ctx)
	if err != nil {
		return err
	}
	defer snap.Remove(context.WithoutCancel(ctx))
	src.Close()
	fmt.Printf("%s snapshot %.19s taken, source closed\n", since(), snap.ID())

	// 3. Fork one sandbox per approach. Each has the data and the library.
	forks, err := snap.Fork(ctx, len(approaches))
	if err != nil {
		return err
	}
	fmt.Printf("%s forked %d sandboxes\n", since(), len(forks))

	// 4. Race them. The first success cancels the others; every loser's
	// sandbox is closed as soon as its attempt has ended.
	race, win := context.WithCancel(ctx)
	defer win()
	var (
		mu     sync.Mutex
		winner = -1
		answer string
		wg     sync.WaitGroup
	)
	for i, sb := range forks {
		wg.Go(func() {
			a := approaches[i]
			r, err := sb.Exec(race, a.script)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, context.Canceled):
				fmt.Printf("%s %-22s cancelled after %v: another approach won\n", since(), a.name, r.Duration.Round(time.Millisecond))
			case err != nil:
				fmt.Printf("%s %-22s sandbox error: %v\n", since(), a.name, err)
			case r.ExitCode != 0:
				fmt.Printf("%s %-22s failed (exit %d): %s\n", since(), a.name, r.ExitCode, strings.TrimSpace(r.Stderr))
			case winner < 0:
				winner, answer = i, strings.TrimSpace(r.Stdout)
				win()
				fmt.Printf("%s %-22s WON in %v: median = %s\n", since(), a.name, r.Duration.Round(time.Millisecond), answer)
				return // keep this sandbox
			default:
				fmt.Printf("%s %-22s also finished (%s), too late\n", since(), a.name, strings.TrimSpace(r.Stdout))
			}
			sb.Close()
		})
	}
	wg.Wait()
	if winner < 0 {
		for _, sb := range forks {
			sb.Close()
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		return errors.New("no approach succeeded")
	}

	// 5. Keep working in the winner's sandbox; it is the only one left.
	kept := forks[winner]
	defer kept.Close()
	if err := kept.WriteFile(ctx, "answer.txt", []byte(answer+"\n"), 0o644); err != nil {
		return err
	}
	r, err = kept.Exec(ctx, `echo "answer.txt: $(cat answer.txt)"`)
	if err != nil {
		return err
	}
	fmt.Printf("%s kept %q in sandbox %.12s; %s", since(), approaches[winner].name, kept.ID(), r.Stdout)
	return nil
}
