//! Incremental UTF-8 validation for text messages that arrive in pieces (RFC 6455 §8.1).

/// Validation state carried across fragment and read boundaries: the bytes of a code point that
/// started in an earlier piece and has not ended yet (at most 3, since a code point is at most 4).
///
/// Four bytes in total, so the decoder can hold it inline without growing past its size budget.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Utf8Carry {
    pending: [u8; 3],
    len: u8,
}

/// `Err(InvalidUtf8)`: the bytes fed so far can never become valid UTF-8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InvalidUtf8;

impl Utf8Carry {
    /// Validates the next piece. An incomplete code point at the end of `piece` is kept for the
    /// next call; a sequence that no continuation can repair fails at once (fail-fast, §8.1).
    pub(crate) fn feed(&mut self, mut piece: &[u8]) -> Result<(), InvalidUtf8> {
        if self.len > 0 {
            let have = usize::from(self.len);
            let width = match self.pending[0] {
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                _ => 4,
            };
            let take = (width - have).min(piece.len());
            let mut point = [0u8; 4];
            point[..have].copy_from_slice(&self.pending[..have]);
            point[have..have + take].copy_from_slice(&piece[..take]);
            match std::str::from_utf8(&point[..have + take]) {
                Ok(_) => {
                    self.len = 0;
                    piece = &piece[take..];
                }
                // Still a valid prefix: the piece ended before the code point did.
                Err(e) if e.error_len().is_none() => {
                    let now = have + take;
                    self.pending[..now].copy_from_slice(&point[..now]);
                    self.len = now as u8;
                    return Ok(());
                }
                Err(_) => return Err(InvalidUtf8),
            }
        }
        match std::str::from_utf8(piece) {
            Ok(_) => Ok(()),
            Err(e) => match e.error_len() {
                Some(_) => Err(InvalidUtf8),
                None => {
                    // A valid prefix of one code point: 1 to 3 bytes.
                    let tail = &piece[e.valid_up_to()..];
                    self.pending[..tail.len()].copy_from_slice(tail);
                    self.len = tail.len() as u8;
                    Ok(())
                }
            },
        }
    }

    /// True when no code point is left open (the message may end here).
    pub(crate) fn is_complete(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::{InvalidUtf8, Utf8Carry};

    #[test]
    fn accepts_valid_text_fed_one_byte_at_a_time() {
        let text = "κόσμε €𝄞 hello";
        let mut carry = Utf8Carry::default();
        for b in text.as_bytes() {
            carry.feed(std::slice::from_ref(b)).unwrap();
        }
        assert!(carry.is_complete());
    }

    #[test]
    fn accepts_valid_text_split_at_every_point() {
        let text = "aé€𝄞z".as_bytes();
        for cut in 0..=text.len() {
            let mut carry = Utf8Carry::default();
            carry.feed(&text[..cut]).unwrap();
            carry.feed(&text[cut..]).unwrap();
            assert!(carry.is_complete(), "cut {cut}");
        }
    }

    #[test]
    fn incomplete_end_is_not_complete() {
        let mut carry = Utf8Carry::default();
        carry.feed(&[b'a', 0xE2, 0x82]).unwrap();
        assert!(!carry.is_complete());
    }

    #[test]
    fn fails_fast_on_impossible_sequences() {
        // A surrogate (U+D800) is refused at its second byte, before the code point ends.
        let mut carry = Utf8Carry::default();
        carry.feed(&[0xED]).unwrap();
        assert_eq!(carry.feed(&[0xA0]), Err(InvalidUtf8));
        // Above U+10FFFF.
        let mut carry = Utf8Carry::default();
        carry.feed(&[0xF4]).unwrap();
        assert_eq!(carry.feed(&[0x90]), Err(InvalidUtf8));
        // A lone continuation byte and a byte that never appears in UTF-8.
        assert_eq!(Utf8Carry::default().feed(&[0x80]), Err(InvalidUtf8));
        assert_eq!(Utf8Carry::default().feed(&[0xFF]), Err(InvalidUtf8));
        // A pending lead byte followed by a non-continuation.
        let mut carry = Utf8Carry::default();
        carry.feed(&[0xC3]).unwrap();
        assert_eq!(carry.feed(b"a"), Err(InvalidUtf8));
    }
}
