//! Strings another process controls, made safe for a terminal. A process names itself
//! (`prctl(PR_SET_NAME)`, argv, a container's name), so its `comm` may hold escape sequences that
//! would move root's cursor, retitle the window or worse. JSON output keeps the raw string (the
//! encoder escapes control characters itself); everything printed as text goes through [`escape`].

use std::{borrow::Cow, fmt::Write};

/// Control characters (C0, DEL, C1) as `\xNN` (ESC as `\e`), and the backslash as `\\` so an
/// escaped name cannot pass for another. Other text, including non-ASCII letters, is unchanged.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\x1b' => out.push_str("\\e"),
            '\\' => out.push_str("\\\\"),
            c if needs_escape(c) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c == '\\' || c.is_control()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_in_a_comm_are_shown_escaped() {
        // Clear screen + move home, an OSC window title ended by BEL, a CSI in C1 form.
        assert_eq!(escape("evil\x1b[2J\x1b[H"), "evil\\e[2J\\e[H");
        assert_eq!(escape("\x1b]0;owned\x07x"), "\\e]0;owned\\x07x");
        assert_eq!(escape("a\u{9b}31mb"), "a\\x9b31mb");
        assert_eq!(escape("tab\there\nnl\r\x7f"), "tab\\x09here\\x0anl\\x0d\\x7f");
        assert_eq!(escape("C:\\x1b"), "C:\\\\x1b", "a literal backslash cannot fake an escape");
    }

    #[test]
    fn ordinary_names_are_unchanged_and_not_copied() {
        for name in ["python3", "pt_main_thread", "trainer-ö", "/trainer", ""] {
            assert!(matches!(escape(name), Cow::Borrowed(s) if s == name));
        }
    }
}
