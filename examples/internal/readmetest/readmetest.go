// Package readmetest reads what the project's READMEs show, so that the
// examples' tests can hold the READMEs to the programs: the console
// sessions a README shows, and the Go blocks it quotes.
package readmetest

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Session is one command of a README's console blocks and the output shown
// under it.
type Session struct {
	Args   []string // the command's arguments, shell-split, the program's name left out
	Output []string // the lines shown under the command, as it prints them
}

// Sessions parses the "```console" blocks of the README at path: a line
// "$ program ..." (continued by lines ending in a backslash) starts a
// command, and the lines up to the next command or the end of the block are
// its output. A command of another program fails the test.
func Sessions(t testing.TB, path, program string) []Session {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()

	var sessions []Session
	var cur *Session
	var cmdLine strings.Builder
	inBlock, continued := false, false
	flush := func() {
		if cur == nil {
			return
		}
		cur.Args = shellSplit(t, cmdLine.String())
		sessions = append(sessions, *cur)
		cur = nil
		cmdLine.Reset()
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !inBlock:
			inBlock = line == "```console"
		case line == "```":
			flush()
			inBlock = false
		case continued:
			cmdLine.WriteString(" " + strings.TrimSuffix(strings.TrimSpace(line), `\`))
			continued = strings.HasSuffix(line, `\`)
		case strings.HasPrefix(line, "$ "):
			flush()
			cur = &Session{}
			rest, ok := strings.CutPrefix(line, "$ "+program+" ")
			require.True(t, ok, "only %s commands are expected: %q", program, line)
			cmdLine.WriteString(strings.TrimSuffix(rest, `\`))
			continued = strings.HasSuffix(line, `\`)
		default:
			require.NotNil(t, cur, "output before any command: %q", line)
			cur.Output = append(cur.Output, line)
		}
	}
	require.NoError(t, sc.Err())
	return sessions
}

// shellSplit splits a command line into words, honouring single quotes.
func shellSplit(t testing.TB, line string) []string {
	t.Helper()
	var words []string
	var w strings.Builder
	inWord, quoted := false, false
	for _, r := range line {
		switch {
		case quoted && r == '\'':
			quoted = false
		case quoted:
			w.WriteRune(r)
		case r == '\'':
			quoted, inWord = true, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	require.False(t, quoted, "unterminated quote in %q", line)
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// RequireQuoted checks that the README of the module at root quotes the
// file at path (relative to root) as it stands, and returns the quote: the
// "```go" block after the comment "<!-- example: path -->" is the whole
// file, the one after "<!-- excerpt: path -->" a verbatim part of it.
func RequireQuoted(t testing.TB, root, kind, path string) string {
	t.Helper()
	return RequireQuotedIn(t, root, "README.md", kind, path)
}

// RequireQuotedIn is RequireQuoted for the document doc (relative to root,
// such as "docs/GUARANTEES.md") instead of the README.
func RequireQuotedIn(t testing.TB, root, doc, kind, path string) string {
	t.Helper()
	require.Contains(t, []string{"example", "excerpt"}, kind)
	text, err := os.ReadFile(filepath.Join(root, doc))
	require.NoError(t, err)
	src, err := os.ReadFile(filepath.Join(root, path))
	require.NoError(t, err)
	marker := "<!-- " + kind + ": " + path + " -->"
	_, after, found := strings.Cut(string(text), marker+"\n```go\n")
	require.True(t, found, "%s has no %s block for %s", doc, kind, path)
	block, _, found := strings.Cut(after, "```\n")
	require.True(t, found, "the %s block for %s in %s does not end", kind, path, doc)
	if kind == "example" {
		require.Equal(t, string(src), block, "the example in %s is not %s as it stands", doc, path)
	} else {
		require.True(t, strings.Contains(string(src), block), "the excerpt in %s is not in %s as it stands:\n%s", doc, path, block)
	}
	return block
}

// Output returns the lines of the "```text" block that follows the comment
// "<!-- output: command -->" in the README at path: what command prints,
// as the README shows it.
func Output(t testing.TB, path, command string) []string {
	t.Helper()
	readme, err := os.ReadFile(path)
	require.NoError(t, err)
	marker := "<!-- output: " + command + " -->\n```text\n"
	_, after, found := strings.Cut(string(readme), marker)
	require.True(t, found, "%s shows no output of %s (%q)", path, command, marker)
	block, _, found := strings.Cut(after, "```\n")
	require.True(t, found, "the output of %s in %s does not end", command, path)
	return strings.Split(strings.TrimSuffix(block, "\n"), "\n")
}
