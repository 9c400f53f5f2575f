package main

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every command's help that names a store names each store idemctl opens.
func TestHelpNamesEveryStore(t *testing.T) {
	names := map[string]string{"redis": "Redis", "rediss": "Redis", "postgres": "PostgreSQL", "mysql": "MySQL"}
	// The stores idemctl opens are the schemes its refusal of another lists.
	_, err := open(context.Background(), "memcached://x", "")
	require.Error(t, err)
	var schemes []string
	for _, m := range regexp.MustCompile(`(\w+)://`).FindAllStringSubmatch(err.Error(), -1) {
		schemes = append(schemes, m[1])
	}
	require.ElementsMatch(t, schemes, keysOfMap(names), "a store idemctl opens without a name here: %v", err)
	helps := map[string]string{"idemctl --help": usage}
	for name, cmd := range commands {
		helps["idemctl "+name+" --help"] = cmd.help
	}
	for what, help := range helps {
		named := 0
		for _, n := range names {
			if strings.Contains(help, n) {
				named++
			}
		}
		if named > 0 {
			for _, n := range names {
				assert.Contains(t, help, n, "%s names a store but not %s", what, n)
			}
		}
	}
	assert.Contains(t, commands["list"].help, "MySQL")
}

func keysOfMap(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
