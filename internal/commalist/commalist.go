package commalist

import "strings"

// Split returns the items of the comma-separated list s, each trimmed of
// white space, without empty ones; nil for a list with no item.
func Split(s string) []string {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
