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
// aside) into a module of its own, outside this repository, whose go.mod
// requires this module through a replace to the repository, and builds
// it: an example that imports one of the repository's internal packages,
// or a file outside its directory, fails. It runs offline, from the module
// cache (GOPROXY=off): go build with -mod=mod adds the requirements the
// example's imports need, from the build list of this module, where go mod
// tidy would also want the modules of its dependencies' own tests, which a
// module cache filled by go mod download need not hold.
func TestExamplesBuildWhenCopied(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every example in a module of its own")
	}
	repo, err := filepath.Abs("..")
	require.NoError(t, err)
	gosum, err := os.ReadFile(filepath.Join(repo, "go.sum"))
	require.NoError(t, err)
	dirs, err := os.ReadDir(".")
	require.NoError(t, err)
	built := 0
	for _, d := range dirs {
		if !d.IsDir() || d.Name() == "internal" {
			continue
		}
		if _, err := os.Stat(filepath.Join(d.Name(), "main.go")); err != nil {
			continue
		}
		built++
		t.Run(d.Name(), func(t *testing.T) {
			dst := t.TempDir()
			files, err := filepath.Glob(filepath.Join(d.Name(), "*.go"))
			require.NoError(t, err)
			for _, f := range files {
				if strings.HasSuffix(f, "_test.go") {
					continue
				}
				b, err := os.ReadFile(f)
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(filepath.Join(dst, filepath.Base(f)), b, 0o644))
			}
			gomod := "module example.com/copied\n\ngo 1.26.0\n\n" +
				"require github.com/idempotency/watermill-idempotency v0.0.0-00010101000000-000000000000\n\n" +
				"replace github.com/idempotency/watermill-idempotency => " + repo + "\n"
			require.NoError(t, os.WriteFile(filepath.Join(dst, "go.mod"), []byte(gomod), 0o644))
			require.NoError(t, os.WriteFile(filepath.Join(dst, "go.sum"), gosum, 0o644))
			for _, args := range [][]string{{"build", "-o", os.DevNull, "."}} {
				cmd := exec.Command("go", args...)
				cmd.Dir = dst
				cmd.Env = append(os.Environ(), "GOPROXY=off", "GOWORK=off", "GOFLAGS=-mod=mod")
				out, err := cmd.CombinedOutput()
				require.NoError(t, err, "go %s in a copy of examples/%s:\n%s", strings.Join(args, " "), d.Name(), out)
			}
		})
	}
	require.GreaterOrEqual(t, built, 7, "every example has a main.go")
}
