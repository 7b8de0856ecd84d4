//! The unconsumed input of a connection: the tail of a partial frame or request head.

/// Unconsumed input, boxed so that a connection with none (every idle one) pays 8 bytes of its
/// record for it instead of the 24 of an empty `Vec`, and owns no buffer.
#[derive(Debug, Default)]
#[allow(clippy::box_collection)] // the box is the point: 8 bytes in the record, not 24
pub(super) struct Input(Option<Box<Vec<u8>>>);

impl Input {
    /// Whether no input is held.
    pub(super) fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|v| v.is_empty())
    }

    /// The input held, oldest byte first.
    pub(super) fn as_slice(&self) -> &[u8] {
        self.0.as_deref().map_or(&[], Vec::as_slice)
    }

    /// Appends `data`.
    pub(super) fn extend(&mut self, data: &[u8]) {
        if !data.is_empty() {
            self.0.get_or_insert_with(Box::default).extend_from_slice(data);
        }
    }

    /// Takes the input out (empty when none), leaving none.
    pub(super) fn take(&mut self) -> Vec<u8> {
        self.0.take().map(|b| *b).unwrap_or_default()
    }

    /// Holds `v` as the input (none when it is empty, freeing its buffer).
    pub(super) fn put(&mut self, v: Vec<u8>) {
        self.0 = if v.is_empty() { None } else { Some(Box::new(v)) };
    }

    /// Drops the first `n` bytes; the buffer goes when nothing is left.
    pub(super) fn consume(&mut self, n: usize) {
        if let Some(v) = &mut self.0 {
            v.drain(..n.min(v.len()));
            if v.is_empty() {
                self.0 = None;
            }
        }
    }

    /// Drops all input and its buffer.
    pub(super) fn clear(&mut self) {
        self.0 = None;
    }
}

#[cfg(test)]
mod tests {
    use super::Input;

    #[test]
    fn holds_no_buffer_when_empty() {
        let mut i = Input::default();
        assert!(i.is_empty());
        i.extend(b"");
        assert!(i.0.is_none());
        i.extend(b"GET / HT");
        i.extend(b"TP/1.1");
        assert_eq!(i.as_slice(), b"GET / HTTP/1.1");
        i.consume(4);
        assert_eq!(i.as_slice(), b"/ HTTP/1.1");
        i.consume(100);
        assert!(i.0.is_none() && i.is_empty());
        i.put(b"ab".to_vec());
        assert_eq!(i.take(), b"ab");
        assert!(i.0.is_none());
        i.put(Vec::with_capacity(64));
        assert!(i.0.is_none());
    }
}
