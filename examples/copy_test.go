package examples_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestExamplesBuildWhenCopied copies each example's Go files (its tests
// aside) into a directory of its own in a module outside this repository,
// whose go.mod requires this module through a replace to the repository,
// and compiles them all with one go build: an example that imports one of
// the repository's internal packages, or needs a file outside its
// directory, fails to compile, and the error names its directory. go build
// of several packages compiles them without linking, which is all a
// missing file or a forbidden import needs, and far cheaper than linking a
// binary per example. It runs offline, from the module cache
// (GOPROXY=off): go build with -mod=mod adds the requirements the examples'
// imports need, from the build list of this module, where go mod tidy
// would also want the modules of its dependencies' own tests, which a
// module cache filled by go mod download need not hold.
func TestExamplesBuildWhenCopied(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every example in a module outside the repository")
	}
	repo, err := filepath.Abs("..")
	require.NoError(t, err)
	gosum, err := os.ReadFile(filepath.Join(repo, "go.sum"))
	require.NoError(t, err)
	dirs, err := os.ReadDir(".")
	require.NoError(t, err)
	dst := t.TempDir()
	var copied []string
	for _, d := range dirs {
		if !d.IsDir() || d.Name() == "internal" {
			continue
		}
		if _, err := os.Stat(filepath.Join(d.Name(), "main.go")); err != nil {
			continue
		}
		copied = append(copied, d.Name())
		files, err := filepath.Glob(filepath.Join(d.Name(), "*.go"))
		require.NoError(t, err)
		require.NoError(t, os.Mkdir(filepath.Join(dst, d.Name()), 0o755))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(dst, d.Name(), filepath.Base(f)), b, 0o644))
		}
	}
	require.GreaterOrEqual(t, len(copied), 7, "every example has a main.go")
	gomod := "module example.com/copied\n\ngo 1.26.0\n\n" +
		"require github.com/idempotency/watermill-idempotency v0.0.0-00010101000000-000000000000\n\n" +
		"replace github.com/idempotency/watermill-idempotency => " + repo + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dst, "go.mod"), []byte(gomod), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dst, "go.sum"), gosum, 0o644))
	cmd := exec.Command("go", "build", "./...")
	cmd.Dir = dst
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build ./... in a module of copies of examples %v:\n%s", copied, out)

	// Every copy was one of the packages built.
	cmd = exec.Command("go", "list", "./...")
	cmd.Dir = dst
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "go list: %s", out)
	for _, name := range copied {
		require.Contains(t, strings.Fields(string(out)), "example.com/copied/"+name)
	}
}
