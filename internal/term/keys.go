package term

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// ErrUnknownKey is returned by Press for a key name it does not know.
var ErrUnknownKey = errors.New("term: unknown key")

// KeyNames describes the key names Press knows, for messages and docs.
const KeyNames = "Enter, Tab, Escape, Backspace, Delete, Insert, Space, Up, Down, Left, Right, " +
	"Home, End, PageUp, PageDown, F1–F12 (names in any case; Esc and Return also), " +
	"C-a … C-z (Ctrl and a letter; also C-@ C-[ C-\\ C-] C-^ C-_), " +
	"M-x (Alt and any single character or key: ESC, then the key)"

// key is what a named key sends: normal, and app in application cursor
// key mode (DECCKM) when it differs.
type key struct{ normal, app string }

// The sequences are xterm's (and those of its terminfo entry, which
// programs read under TERM=xterm-256color). vt's SendKey is not used: it
// writes to the same pipe as the emulator's replies, so its bytes could not
// be queued whole or refused whole, and it sends CSI H / CSI F for Home and
// End whatever the cursor key mode.
var keys = map[string]key{
	"enter":     {normal: "\r"},
	"return":    {normal: "\r"},
	"tab":       {normal: "\t"},
	"escape":    {normal: "\x1b"},
	"esc":       {normal: "\x1b"},
	"backspace": {normal: "\x7f"},
	"delete":    {normal: "\x1b[3~"},
	"insert":    {normal: "\x1b[2~"},
	"space":     {normal: " "},
	"up":        {normal: "\x1b[A", app: "\x1bOA"},
	"down":      {normal: "\x1b[B", app: "\x1bOB"},
	"right":     {normal: "\x1b[C", app: "\x1bOC"},
	"left":      {normal: "\x1b[D", app: "\x1bOD"},
	"home":      {normal: "\x1b[H", app: "\x1bOH"},
	"end":       {normal: "\x1b[F", app: "\x1bOF"},
	"pageup":    {normal: "\x1b[5~"},
	"pagedown":  {normal: "\x1b[6~"},
	"f1":        {normal: "\x1bOP"},
	"f2":        {normal: "\x1bOQ"},
	"f3":        {normal: "\x1bOR"},
	"f4":        {normal: "\x1bOS"},
	"f5":        {normal: "\x1b[15~"},
	"f6":        {normal: "\x1b[17~"},
	"f7":        {normal: "\x1b[18~"},
	"f8":        {normal: "\x1b[19~"},
	"f9":        {normal: "\x1b[20~"},
	"f10":       {normal: "\x1b[21~"},
	"f11":       {normal: "\x1b[23~"},
	"f12":       {normal: "\x1b[24~"},
}

// keyBytes returns the bytes key name sends; app is the cursor key mode.
func keyBytes(name string, app bool) (string, error) {
	if k, ok := keys[strings.ToLower(name)]; ok {
		if app && k.app != "" {
			return k.app, nil
		}
		return k.normal, nil
	}
	if rest, ok := cutPrefixFold(name, "M-"); ok && rest != "" {
		if utf8.RuneCountInString(rest) == 1 && utf8.ValidString(rest) {
			return "\x1b" + rest, nil
		}
		if seq, err := keyBytes(rest, app); err == nil {
			return "\x1b" + seq, nil
		}
	}
	if rest, ok := cutPrefixFold(name, "C-"); ok && len(rest) == 1 {
		c := rest[0]
		if c >= 'a' && c <= 'z' {
			c -= 'a' - 'A'
		}
		if c >= '@' && c <= '_' {
			return string(rune(c & 0x1f)), nil
		}
	}
	return "", fmt.Errorf("%w %q: known keys are %s", ErrUnknownKey, name, KeyNames)
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix) {
		return s[len(prefix):], true
	}
	return s, false
}
