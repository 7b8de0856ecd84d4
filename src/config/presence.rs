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

/// Checks `[presence]` and the presence keys of every `[[channels]]` rule.
pub(super) fn validate(c: &Config) -> Result<(), ConfigError> {
    let p = &c.presence;
    super::validate::range("presence.window_ms", p.window_ms, 10, MAX_WINDOW_MS)?;
    super::validate::range("presence.max_diff", p.max_diff, 1, 10_000)?;
    super::validate::range("presence.info_max_bytes", p.info_max_bytes, 2, MAX_INFO_BYTES)?;
    super::validate::range("presence.page_size", p.page_size, 1, MAX_PAGE_SIZE)?;
    super::validate::range("presence.member_ttl_ms", p.member_ttl_ms, 3_000, 600_000)?;
    for (i, rule) in c.channels.iter().enumerate() {
        if rule.join_leave && !rule.presence {
            return Err(ConfigError::new(
                format!("channels[{i}].join_leave"),
                true,
                "needs presence = true in the same rule (join/leave is presence's diff)",
            ));
        }
        super::validate::range(
            &format!("channels[{i}].presence_max_members"),
            rule.presence_max_members,
            1,
            MAX_PRESENCE_MEMBERS,
        )?;
    }
    Ok(())
}
