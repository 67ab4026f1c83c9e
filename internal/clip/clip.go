// Package clip shortens text that comes from outside (an id, a stored
// value) before an error or log message quotes it.
package clip

// maxLen is how many bytes of a text a message quotes.
const maxLen = 40

// Text returns s when it is at most 40 bytes long, else its first 40 bytes
// followed by "..." (cut at a byte, not a character boundary).
func Text(s string) string {
	if len(s) > maxLen {
		return s[:maxLen] + "..."
	}
	return s
}
