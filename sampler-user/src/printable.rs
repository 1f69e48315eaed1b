//! Names taken from profiled processes are data, never markup or terminal commands.
//!
//! Owns: the one rule for showing such a name (a comm, thread name, function or file name,
//! command line) in a terminal or a line-based text format ([`printable`]): every control
//! character (C0, DEL, C1: ESC, BEL, CR, LF, TAB…) and every bidirectional override becomes `?`,
//! so a process cannot move the cursor, retitle the terminal, clear the screen, forge lines of
//! output or reorder what is shown. XML escaping of the same names is inferno's, on labels made
//! printable first. JSON writers keep the names as they are (JSON escapes them).

use std::borrow::Cow;

/// Whether `c` must not reach a terminal or a line-based format as is.
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        // Bidirectional embeddings, overrides and isolates (Unicode Bidi_Control), which
        // reorder what follows them on screen.
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{061c}')
}

/// `s` with every unsafe character (see [`is_unsafe`]) replaced by `?`.
pub fn printable(s: &str) -> Cow<'_, str> {
    if s.chars().any(is_unsafe) {
        Cow::Owned(
            s.chars()
                .map(|c| if is_unsafe(c) { '?' } else { c })
                .collect(),
        )
    } else {
        Cow::Borrowed(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_overrides_are_replaced() {
        assert_eq!(printable("plain (x.py:3) é 数据"), "plain (x.py:3) é 数据");
        assert!(matches!(printable("plain"), Cow::Borrowed(_)));
        assert_eq!(
            printable("a\u{1b}]0;pwned\u{7}b\r\nc\td\u{7f}e\u{9b}f\u{202e}g"),
            "a?]0;pwned?b??c?d?e?f?g"
        );
    }
}
