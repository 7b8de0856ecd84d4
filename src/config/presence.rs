//! Presence (`[presence]` and the presence keys of a `[[channels]]` rule, docs/protocol.md,
//! "Presence"): how joins and leaves are coalesced, how large a member's `info` may be, how
//! large a `presence` page is; with their defaults and validation.

use serde::Deserialize;

use super::{Config, ConfigError};

/// Largest `presence.window_ms`: a window longer than this leaves members' views stale for
/// too long to be useful.
const MAX_WINDOW_MS: u64 = 60_000;
/// Largest `presence.info_max_bytes`.
const MAX_INFO_BYTES: usize = 16_384;
/// Largest `presence.page_size`.
const MAX_PAGE_SIZE: usize = 10_000;
/// Bytes of an upgrade request's head besides a token's `info`: the request line, the usual
/// browser headers and the JWT's other claims, header and signature (checked against
/// `limits.max_header_bytes` with `presence.info_max_bytes`).
const TOKEN_OVERHEAD_BYTES: usize = 2048;
/// Largest `channels[].presence_max_members`.
pub const MAX_PRESENCE_MEMBERS: usize = 10_000_000;

/// How presence works on every channel whose rule turns it on (`[presence]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Presence {
    /// Milliseconds over which a channel's joins and leaves are coalesced into one
    /// `presence_diff` (or one `presence_reset`), encoded once and sent to every `join_leave`
    /// subscriber. Default 500, between 10 and 60,000. Trade-off: a longer window sends fewer
    /// frames in a busy room and shows changes later.
    pub window_ms: u64,
    /// Most joins plus leaves one window's `presence_diff` carries; a window with more sends
    /// `presence_reset` instead ("fetch again"), so a reconnect herd of N members costs each
    /// member one frame per window, not N. Default 100, between 1 and 10,000.
    pub max_diff: usize,
    /// Largest `info` claim of a token, in bytes of compact JSON: a token whose `info` is larger
    /// is refused at the upgrade (401) and at `refresh`. Default 1024, at most 16,384. Every
    /// member's `info` is held by the channel's home and sent in every page and diff that
    /// names it.
    pub info_max_bytes: usize,
    /// Members per `presence` answer; a larger room is paged (`next` / `cursor`). Default
    /// 1000, between 1 and 10,000. Trade-off: a larger page is fewer requests and a larger
    /// frame in the client's queue.
    pub page_size: usize,
    /// With the Redis broker: milliseconds a member's entry lives after its node last
    /// refreshed it (every third of this). A node killed with `kill -9` has its members removed,
    /// and their leaves announced, within it. Default 30,000, between 3,000 and 600,000.
    /// Shorter notices dead nodes sooner, at more refresh calls (one per presence channel with
    /// members per node per third of this).
    pub member_ttl_ms: u64,
}

impl Default for Presence {
    fn default() -> Self {
        Presence { window_ms: 500, max_diff: 100, info_max_bytes: 1024, page_size: 1000, member_ttl_ms: 30_000 }
    }
}

impl Config {
    /// Largest presence frame in bytes: a quarter of `limits.queue_max_bytes`. A `presence`
    /// page stops there (with `next`), and a window whose `presence_diff` would be larger is
    /// sent as `presence_reset`, so an answer or a diff always fits a reading client's queue
    /// (a frame larger than the queue would close it with 1013, and a client reconnecting
    /// after 1013 would ask again).
    pub fn presence_frame_max_bytes(&self) -> usize {
        self.limits.queue_max_bytes / 4
    }
}

/// Checks `[presence]` and the presence keys of every `[[channels]]` rule.
pub(super) fn validate(c: &Config) -> Result<(), ConfigError> {
    let p = &c.presence;
    super::validate::range("presence.window_ms", p.window_ms, 10, MAX_WINDOW_MS)?;
    super::validate::range("presence.max_diff", p.max_diff, 1, 10_000)?;
    super::validate::range("presence.info_max_bytes", p.info_max_bytes, 2, MAX_INFO_BYTES)?;
    super::validate::range("presence.page_size", p.page_size, 1, MAX_PAGE_SIZE)?;
    super::validate::range("presence.member_ttl_ms", p.member_ttl_ms, 3_000, 600_000)?;
    // The token carries `info` base64url-encoded (4/3 of its bytes) in the upgrade request's
    // head, with the rest of the JWT: a token whose `info` is at the bound must still fit
    // `limits.max_header_bytes`, or it is refused with 431 before its `info` is looked at.
    let token_bytes = p.info_max_bytes.div_ceil(3) * 4 + TOKEN_OVERHEAD_BYTES;
    if c.auth.is_some() && c.channels.iter().any(|r| r.presence) && token_bytes > c.limits.max_header_bytes {
        return Err(ConfigError::new(
            "presence.info_max_bytes",
            p.info_max_bytes,
            format!(
                "a token whose info is this large takes about {token_bytes} bytes of the upgrade request's head, \
                 more than limits.max_header_bytes ({}): lower it or raise limits.max_header_bytes",
                c.limits.max_header_bytes
            ),
        ));
    }
    for (i, rule) in c.channels.iter().enumerate() {
        if rule.join_leave && !rule.presence {
            return Err(ConfigError::new(
                format!("channels[{i}].join_leave"),
                true,
                "needs presence = true in the same rule (join/leave is presence's diff)",
            ));
        }
        if let Some(max) = rule.presence_max_members {
            if !rule.presence {
                return Err(ConfigError::new(
                    format!("channels[{i}].presence_max_members"),
                    max,
                    "needs presence = true in the same rule (it bounds the channel's presence)",
                ));
            }
            super::validate::range(&format!("channels[{i}].presence_max_members"), max, 1, MAX_PRESENCE_MEMBERS)?;
        }
    }
    Ok(())
}
