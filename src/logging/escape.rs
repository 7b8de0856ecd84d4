//! Client-controlled bytes in log lines, escaped (docs/security.md, "Logs").

use std::fmt;

/// Input bytes shown at most; the rest is counted, not written, so one client cannot make one
/// log line arbitrarily long.
pub const MAX_LOGGED_BYTES: usize = 256;

/// Bytes a client chose (a channel name, a header value, a close reason, a request target),
/// made safe to write into a log line: nothing in them can start a new line, move the cursor,
/// change colours (ANSI `ESC [`, the C1 `CSI`) or reorder text (bidi overrides).
///
/// Printable ASCII (0x20–0x7E) is written as is, except `\` and `"`, which are written `\\`
/// and `\"`; tab, LF and CR as `\t`, `\n`, `\r`; every other byte, control or not ASCII
/// (so each byte of a UTF-8 sequence), as `\xNN`. At most [`MAX_LOGGED_BYTES`] input bytes are
/// written; longer input ends in `…(+N bytes)`. `Display` writes the escaped text, `Debug` the
/// same in double quotes (for `field = ?Escaped(…)` in `tracing` macros).
#[derive(Clone, Copy)]
pub struct Escaped<'a>(pub &'a [u8]);

impl<'a> Escaped<'a> {
    /// The escaped form of a string.
    pub fn str(s: &'a str) -> Self {
        Escaped(s.as_bytes())
    }
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = &self.0[..self.0.len().min(MAX_LOGGED_BYTES)];
        // Runs of bytes that need no escape are written in one call.
        let mut plain = 0;
        for (i, &b) in shown.iter().enumerate() {
            let escape = match b {
                b'\\' => "\\\\",
                b'"' => "\\\"",
                b'\t' => "\\t",
                b'\n' => "\\n",
                b'\r' => "\\r",
                0x20..=0x7e => continue,
                _ => "",
            };
            // Only printable ASCII was skipped over, so this slice is valid UTF-8.
            f.write_str(std::str::from_utf8(&shown[plain..i]).unwrap_or_default())?;
            if escape.is_empty() {
                write!(f, "\\x{b:02x}")?;
            } else {
                f.write_str(escape)?;
            }
            plain = i + 1;
        }
        f.write_str(std::str::from_utf8(&shown[plain..]).unwrap_or_default())?;
        if self.0.len() > shown.len() {
            write!(f, "…(+{} bytes)", self.0.len() - shown.len())?;
        }
        Ok(())
    }
}

impl fmt::Debug for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

#[cfg(test)]
mod tests {
    use super::{Escaped, MAX_LOGGED_BYTES};

    #[test]
    fn printable_ascii_stays_and_the_rest_is_escaped() {
        assert_eq!(Escaped(b"prices.btc:1-a_b").to_string(), "prices.btc:1-a_b");
        assert_eq!(Escaped(b"a\nb\x1b[31mred\r\t").to_string(), "a\\nb\\x1b[31mred\\r\\t");
        assert_eq!(Escaped(b"q\"uote\\").to_string(), "q\\\"uote\\\\");
        assert_eq!(Escaped(b"\x00\x07\x7f\xff").to_string(), "\\x00\\x07\\x7f\\xff");
        // UTF-8 C1 CSI (U+009B) and a right-to-left override (U+202E): byte by byte.
        assert_eq!(Escaped::str("\u{9b}31m\u{202e}").to_string(), "\\xc2\\x9b31m\\xe2\\x80\\xae");
        assert_eq!(format!("{:?}", Escaped(b"a\nb")), "\"a\\nb\"");
        assert_eq!(Escaped(b"").to_string(), "");
    }

    #[test]
    fn output_is_printable_ascii_for_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        let out = Escaped(&all).to_string();
        assert!(out.bytes().all(|b| (0x20..=0x7e).contains(&b)), "{out}");
    }

    #[test]
    fn long_input_is_capped_and_counted() {
        let long = vec![b'a'; MAX_LOGGED_BYTES + 10];
        let out = Escaped(&long).to_string();
        assert_eq!(out, format!("{}…(+10 bytes)", "a".repeat(MAX_LOGGED_BYTES)));
        let exact = vec![b'\n'; MAX_LOGGED_BYTES];
        assert_eq!(Escaped(&exact).to_string(), "\\n".repeat(MAX_LOGGED_BYTES));
    }
}
