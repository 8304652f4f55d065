//! Every line stevedore prints itself goes through here: text an image, a command, a handler
//! or an engine supplied may hold control characters (ESC sequences that retitle or clear a
//! terminal, a newline that forges a line of stevedore's own), so they are escaped.

pub use stevedore_init::wire::printable;

/// Prints `stevedore: MESSAGE` on stderr, escaped.
pub fn say(message: impl std::fmt::Display) {
    eprintln!("stevedore: {}", printable(&message.to_string()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_and_bidi_characters_are_shown_not_obeyed() {
        assert_eq!(printable("plain text, ünïcode ✓"), "plain text, ünïcode ✓");
        assert_eq!(printable("a\x1b]0;pwned\x07b"), "a\\u{1b}]0;pwned\\u{7}b");
        assert_eq!(printable("x\nstevedore: ok in 1 ms"), "x\\nstevedore: ok in 1 ms");
        assert_eq!(printable("\x1b[2J\x1b[H"), "\\u{1b}[2J\\u{1b}[H");
        assert_eq!(printable("\u{9b}31m"), "\\u{9b}31m", "C1 controls too");
        assert_eq!(printable("ok\u{202e}deliaf"), "ok\\u{202e}deliaf");
        // Issue 41, 4: separators and invisible format characters, whose line breaks or
        // hidden text a terminal or a page would obey.
        assert_eq!(printable("a\u{2028}b\u{2029}c"), "a\\u{2028}b\\u{2029}c");
        assert_eq!(printable("x\u{200b}y\u{feff}z\u{2060}\u{e0001}"), "x\\u{200b}y\\u{feff}z\\u{2060}\\u{e0001}");
        assert_eq!(printable("\u{00ad}\u{061c}\u{2066}"), "\\u{ad}\\u{61c}\\u{2066}", "every Cf, from the tables");
        assert!(printable("\r\t\0").chars().all(|c| !c.is_control()));
    }
}
