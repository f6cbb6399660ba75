package examples_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestExamplesCopied copies each example program into a fresh module of
// its own — what a user does with an example — and builds it there:
// examples use only the public API (no internal package), and their
// dependencies resolve with this module's go.mod and go.sum. No engine is
// used; the go command works offline from the module cache this module's
// own build filled.
func TestExamplesCopied(t *testing.T) {
	t.Parallel()
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	library := filepath.Dir(here)
	mod, err := os.ReadFile(filepath.Join(here, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(here, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	// This module's requirements (the library among them), so that
	// versions match the ones tested; its replace of the library by the
	// directory above becomes an absolute one.
	requires := string(mod[strings.Index(string(mod), "require"):strings.Index(string(mod), "replace")])
	dirs, err := filepath.Glob(filepath.Join(here, "*", "main.go"))
	if err != nil || len(dirs) == 0 {
		t.Fatalf("examples: %v %v", dirs, err)
	}
	for _, main := range dirs {
		dir := filepath.Dir(main)
		name := filepath.Base(dir)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dst := t.TempDir()
			files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
			for _, f := range files {
				if strings.HasSuffix(f, "_test.go") {
					continue
				}
				data, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(string(data), "/internal/") {
					t.Errorf("%s imports an internal package of the library", filepath.Base(f))
				}
				if err := os.WriteFile(filepath.Join(dst, filepath.Base(f)), data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			gomod := "module example.com/" + name + "\n\ngo 1.26.0\n\n" +
				requires + "replace github.com/agentsandbox/sandbox => " + library + "\n"
			if err := os.WriteFile(filepath.Join(dst, "go.mod"), []byte(gomod), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dst, "go.sum"), sum, 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("go", "build", "-o", os.DevNull, ".")
			cmd.Dir = dst
			cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOSUMDB=off", "GOWORK=off")
			out, err := cmd.CombinedOutput()
			if err != nil && strings.Contains(string(out), "module lookup disabled by GOPROXY=off") {
				// Tests do not download: the module cache lacks what go
				// test ./... (or go mod download) would have fetched.
				if os.Getenv("CI") == "true" {
					t.Fatalf("CI=true: cannot skip: the module cache lacks the example's dependencies:\n%s", out)
				}
				t.Skip("the module cache lacks the example's dependencies: run go mod download first")
			}
			if err != nil {
				t.Errorf("building a copy of examples/%s in its own module: %v\n%s", name, err, out)
			}
		})
	}
}
