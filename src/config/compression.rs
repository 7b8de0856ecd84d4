//! permessage-deflate (`[compression]`, RFC 7692; docs/configuration.md, docs/protocol.md
//! "Compression"): whether it is offered, what is worth compressing and how hard.

use serde::Deserialize;

use super::{Config, ConfigError};
use crate::ws::deflate::DeflateConfig;

/// Largest `compression.min_bytes` (a message this large is compressed at any setting of it).
const MAX_MIN_BYTES: usize = 1 << 20;

/// permessage-deflate (`[compression]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Compression {
    /// Accept a client's `permessage-deflate` offer (RFC 7692; every browser makes one).
    /// Default true. tether answers with `server_no_context_takeover;
    /// client_no_context_takeover`: each message is compressed once for the whole process
    /// and the one compressed frame is shared by every subscriber that negotiated it, and
    /// each core holds one compressor and one inflater, never one per connection. Trade-off:
    /// fewer bytes on the wire for JSON-sized messages, at one compression per message (not
    /// per subscriber) and one inflation per compressed client message. false: the offer is
    /// declined and every frame goes plain.
    pub enabled: bool,
    /// Messages whose payload is shorter than this many bytes go plain (RSV1 clear) even to
    /// a subscriber that negotiated compression; so do control frames and replies. Default
    /// 256, between 0 and 1,048,576. Trade-off: below a few hundred bytes DEFLATE without
    /// context takeover saves little (a 98-byte trade tick shrinks to 88) and costs a
    /// compression per message.
    pub min_bytes: usize,
    /// zlib compression level, 1 (fastest) to 9 (smallest). Default 6. Paid once per
    /// published message, not per subscriber. Trade-off: a 1,003-byte JSON order book
    /// compresses to 507 bytes at 1, 364 at 6, 354 at 9 (docs/architecture.md,
    /// permessage-deflate).
    pub level: u32,
}

impl Default for Compression {
    fn default() -> Self {
        Compression { enabled: true, min_bytes: 256, level: 6 }
    }
}

impl Compression {
    /// What a core's [`crate::ws::deflate::Deflate`] is built with; `None` when compression
    /// is off.
    pub fn deflate(&self) -> Option<DeflateConfig> {
        self.enabled.then_some(DeflateConfig { min_bytes: self.min_bytes, level: self.level })
    }
}

/// Checks `[compression]`.
pub(super) fn validate(c: &Config) -> Result<(), ConfigError> {
    super::validate::range("compression.min_bytes", c.compression.min_bytes, 0, MAX_MIN_BYTES)?;
    super::validate::range("compression.level", c.compression.level, 1, 9)?;
    Ok(())
}
