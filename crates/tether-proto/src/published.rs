//! [`Published`]: one published message in every encoding a subscriber may take, each made at
//! most once for the whole process and only when some subscriber takes it.
//!
//! The home core (or, with Redis, the node's link) encodes a message's plain WebSocket frame
//! once and hands the same `Arc<Published>` to every core with subscribers. Any other encoding
//! (permessage-deflate, RFC 7692) is made by whichever core first meets a subscriber that
//! negotiated it ([`Published::encoded`], a [`OnceLock`] per encoding): a message nobody takes
//! compressed is never compressed, and one that thousands take is compressed once.
//!
//! A Server-Sent Events stream's event ([`Encoding::Sse`]) is one more such encoding.
//!
//! Adding an encoding is its [`Encoding`] variant, one `OnceLock` field here with its arm in
//! `Published::slot`, and its arm in the server's maker (`src/server/encodings.rs`).

use std::sync::OnceLock;

use bytes::Bytes;

/// How a subscriber takes its messages: the bytes a connection is sent for one published
/// message. A session says which it takes ([`crate::session::Session::encoding`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// The plain WebSocket text frame (RFC 6455 §5.6), RSV1 clear.
    Plain,
    /// permessage-deflate (RFC 7692 §7.2.1): the payload compressed on its own (no context
    /// takeover), RSV1 set; a message under `compression.min_bytes`, or one that does not
    /// shrink, stays plain.
    Deflate,
    /// A Server-Sent Events stream (`GET /sse`, WHATWG HTML §9.2): the message as one
    /// `event: msg` with `id: CH:EPOCH:SEQ` and the plain frame's `msg` object as `data`
    /// ([`crate::sse::msg_from_frame`]). Made under the channel's epoch, which the caller
    /// passes to its maker: the plain frame does not carry it.
    Sse,
}

impl Encoding {
    /// Number of encodings, for tables indexed by [`Encoding::index`].
    pub const COUNT: usize = 3;

    /// Dense index in `0..COUNT`, for per-encoding tables.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Lowercase name, as metrics and logs label it.
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Plain => "plain",
            Encoding::Deflate => "deflate",
            Encoding::Sse => "sse",
        }
    }
}

/// One published message: its plain WebSocket frame, encoded once, and the other encodings,
/// each made lazily once. Shared across cores as `Arc<Published>` (made once per message, so
/// its atomic count is paid once per core, not once per subscriber).
#[derive(Debug)]
pub struct Published {
    /// The complete plain `msg` frame (header and payload), what every subscriber took before
    /// any encoding existed.
    frame: Bytes,
    /// The permessage-deflate frame, or the plain frame again when compressing does not pay.
    deflate: OnceLock<Bytes>,
    /// The SSE event.
    sse: OnceLock<Bytes>,
}

impl Published {
    /// A message whose plain frame is `frame` (a complete, unmasked, FIN text frame).
    pub fn new(frame: Bytes) -> Published {
        Published { frame, deflate: OnceLock::new(), sse: OnceLock::new() }
    }

    /// The plain frame.
    pub fn frame(&self) -> &Bytes {
        &self.frame
    }

    /// The frame in encoding `enc`: the plain one for [`Encoding::Plain`]; otherwise the one
    /// made by the first caller's `make` (given this message), which every later caller, on
    /// any core, shares. Callers racing on the first use wait for one `make`.
    pub fn encoded(&self, enc: Encoding, make: impl FnOnce(&Published) -> Bytes) -> &Bytes {
        match self.slot(enc) {
            None => &self.frame,
            Some(slot) => slot.get_or_init(|| make(self)),
        }
    }

    /// The frame in encoding `enc` if it was made (the plain one always is).
    pub fn get(&self, enc: Encoding) -> Option<&Bytes> {
        match self.slot(enc) {
            None => Some(&self.frame),
            Some(slot) => slot.get(),
        }
    }

    /// Whether `bytes` is this message's plain frame itself (an encoding that fell back to
    /// plain shares it), so a core can share one local copy between both.
    pub fn is_plain(&self, bytes: &Bytes) -> bool {
        bytes.as_ptr() == self.frame.as_ptr() && bytes.len() == self.frame.len()
    }

    fn slot(&self, enc: Encoding) -> Option<&OnceLock<Bytes>> {
        match enc {
            Encoding::Plain => None,
            Encoding::Deflate => Some(&self.deflate),
            Encoding::Sse => Some(&self.sse),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    #[test]
    fn an_encoding_is_made_once_for_every_core() {
        let p = Arc::new(Published::new(Bytes::from_static(b"\x81\x02{}")));
        assert!(p.get(Encoding::Deflate).is_none(), "nothing made before it is asked for");
        let made = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (p, made) = (p.clone(), made.clone());
                std::thread::spawn(move || {
                    p.encoded(Encoding::Deflate, |m| {
                        made.fetch_add(1, Ordering::SeqCst);
                        Bytes::from(m.frame().to_vec())
                    })
                    .clone()
                })
            })
            .collect();
        for t in threads {
            assert_eq!(&t.join().unwrap()[..], b"\x81\x02{}");
        }
        assert_eq!(made.load(Ordering::SeqCst), 1);
        assert!(!p.is_plain(p.get(Encoding::Deflate).unwrap()), "a copy is not the plain frame");
        assert!(p.is_plain(p.encoded(Encoding::Plain, |_| unreachable!())));
    }

    #[test]
    fn the_sse_event_has_its_own_slot_made_once() {
        let p = Published::new(crate::protocol::msg_frame("c", 3, "1"));
        let make = |m: &Published| crate::sse::msg_from_frame(m.frame(), "e").expect("a msg frame");
        let first = p.encoded(Encoding::Sse, make).clone();
        assert!(first.starts_with(b"event: msg\nid: c:e:3\n"));
        let again = p.encoded(Encoding::Sse, |_| unreachable!("made once"));
        assert_eq!(again.as_ptr(), first.as_ptr(), "shared, not copied");
        assert!(p.get(Encoding::Deflate).is_none(), "other encodings untouched");
    }
}
