//! Naming entries whose names are not UTF-8.

use std::fmt::Write as _;

/// Renders raw name bytes as UTF-8, losslessly: valid UTF-8 stays as is, each invalid byte
/// becomes `\xNN` and a backslash becomes `\\`.
pub fn escape_name(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            // Backslashes are doubled so that a literal `\x80` in a name cannot be mistaken
            // for an escaped byte.
            if c == '\\' {
                out.push_str("\\\\");
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_invalid_bytes_and_backslashes() {
        assert_eq!(escape_name(b"plain/\xc3\xa9"), "plain/é");
        assert_eq!(escape_name(b"a\xffb\\x"), "a\\xffb\\\\x");
        assert_ne!(escape_name(b"\x80"), escape_name(b"\\x80"));
    }
}
