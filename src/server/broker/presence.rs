//! Presence at a channel's home (memory broker; docs/protocol.md, "Presence"): who is in each
//! presence channel homed on this core, and the joins and leaves of the window in progress.
//! Sans-IO: the memory broker feeds it joins, leaves and queries with the time, and routes the
//! frames it returns.
//!
//! A member is one connection, keyed by its core and connection id ([`MemberKey`]). Changes
//! are coalesced per channel over `presence.window_ms`: a join and a leave of the same member
//! in one window cancel out, and when a window closes its changes become one `presence_diff`
//! frame, or, past `presence.max_diff` changes, one `presence_reset` frame ("fetch again").
//! Each frame is encoded once for every `join_leave` subscriber on every core, so a reconnect
//! herd of N members costs each member one frame per window, not N.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;

use crate::protocol::presence::{self, Member};
use crate::server::bus::PresenceRow;
use crate::server::conn::ConnId;

/// A member's key at its home: its core and its connection id there. Ordered, so a page of
/// members ends at a key the next page starts after.
pub type MemberKey = (u16, u32, u32);

/// The key of connection `conn` on core `core`.
pub fn member_key(core: u16, conn: ConnId) -> MemberKey {
    (core, conn.key, conn.gen)
}

/// A page's `cursor` / `next` for the page that starts after `key`: `core-key-gen`.
pub fn cursor_of(key: MemberKey) -> String {
    format!("{}-{}-{}", key.0, key.1, key.2)
}

/// The key a `cursor` names, when it is written as [`cursor_of`] writes one (no sign, no
/// leading zero) with a core below `cores`; `None` otherwise. A well-formed cursor is a
/// position in the members' order: the page starts after it, whichever page gave it.
pub fn parse_cursor(cursor: &str, cores: usize) -> Option<MemberKey> {
    let mut parts = cursor.split('-');
    let key: MemberKey = (parts.next()?.parse().ok()?, parts.next()?.parse().ok()?, parts.next()?.parse().ok()?);
    let canonical = parts.next().is_none() && cursor_of(key) == cursor;
    (canonical && usize::from(key.0) < cores).then_some(key)
}

/// What changed of one member in the window in progress.
#[derive(Debug)]
enum Change {
    Joined(Member),
    Left(Member),
}

/// What a closed window announces: its `presence_diff` frame, or the `presence_reset` frame
/// of a window with more than `presence.max_diff` changes.
#[derive(Debug, Clone)]
pub enum Announcement {
    /// Who joined and who left.
    Diff(Bytes),
    /// Too much changed: ask `presence` again.
    Reset(Bytes),
}

impl Announcement {
    /// The encoded frame.
    pub fn frame(&self) -> &Bytes {
        match self {
            Announcement::Diff(f) | Announcement::Reset(f) => f,
        }
    }
}

/// Whether a join was tracked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joined {
    /// The member is listed and counted (and announced when the window closes).
    Tracked,
    /// The channel already tracks `presence_max_members`: subscribed, but not tracked.
    Untracked,
}

/// One channel's presence at its home.
#[derive(Debug, Default)]
pub struct ChannelPresence {
    members: BTreeMap<MemberKey, Member>,
    /// Members per user (`Member::user`), for `presence_stats.users`.
    users: HashMap<Arc<str>, u32>,
    /// Subscribers past `presence_max_members`, not tracked.
    untracked: u64,
    /// The net changes of the window in progress.
    window: HashMap<MemberKey, Change>,
}

impl ChannelPresence {
    /// Members tracked now.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether it tracks no member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Whether it tracks nobody, counts no untracked subscriber and has no window open: it can
    /// be forgotten.
    pub fn is_idle(&self) -> bool {
        self.members.is_empty() && self.untracked == 0 && self.window.is_empty()
    }

    /// Whether a window is open (changes wait to be announced).
    pub fn has_changes(&self) -> bool {
        !self.window.is_empty()
    }

    /// `member` joined as `key`; tracked unless the channel already tracks `max_members`.
    pub fn join(&mut self, key: MemberKey, member: Member, max_members: usize) -> Joined {
        if self.members.len() >= max_members {
            self.untracked += 1;
            return Joined::Untracked;
        }
        if let Some(u) = &member.user {
            *self.users.entry(u.clone()).or_insert(0) += 1;
        }
        self.members.insert(key, member.clone());
        match self.window.remove(&key) {
            // It left and came back within the window: nothing changed for the others.
            Some(Change::Left(_)) => {}
            _ => {
                self.window.insert(key, Change::Joined(member));
            }
        }
        Joined::Tracked
    }

    /// The member `key` left (its subscription ended). A key not tracked was an untracked
    /// subscriber.
    pub fn leave(&mut self, key: MemberKey) {
        let Some(member) = self.members.remove(&key) else {
            self.untracked = self.untracked.saturating_sub(1);
            return;
        };
        if let Some(u) = &member.user {
            if let Some(n) = self.users.get_mut(u) {
                *n -= 1;
                if *n == 0 {
                    self.users.remove(u);
                }
            }
        }
        match self.window.remove(&key) {
            // It joined within the window: the others never saw it.
            Some(Change::Joined(_)) => {}
            _ => {
                self.window.insert(key, Change::Left(member));
            }
        }
    }

    /// Up to `n` members after `after` (from the first when `None`) whose JSON takes at most
    /// `max_bytes` (at least one member, whatever its size), and the cursor of the next page
    /// when more follow.
    pub fn page(&self, after: Option<MemberKey>, n: usize, max_bytes: usize) -> (Vec<&Member>, Option<String>) {
        let mut it = match after {
            Some(k) => self.members.range((std::ops::Bound::Excluded(k), std::ops::Bound::Unbounded)),
            None => self.members.range(..),
        };
        let mut page: Vec<(&MemberKey, &Member)> = Vec::new();
        let mut bytes = 0;
        let mut rest = None;
        for (k, m) in it.by_ref() {
            bytes += m.json_len();
            if page.len() == n || (bytes > max_bytes && !page.is_empty()) {
                rest = Some(k);
                break;
            }
            page.push((k, m));
        }
        let next = match (page.last(), rest) {
            (Some((k, _)), Some(_)) => Some(cursor_of(**k)),
            _ => None,
        };
        (page.into_iter().map(|(_, m)| m).collect(), next)
    }

    /// (connections, distinct users) tracked now.
    pub fn stats(&self) -> (u64, u64) {
        (self.members.len() as u64, self.users.len() as u64)
    }

    /// Closes the window: the frame that announces it (`presence_diff`, or `presence_reset`
    /// past `max_diff` changes or when the diff's members would take more than `max_bytes`),
    /// `None` when its changes cancelled out.
    pub fn close_window(&mut self, ch: &str, max_diff: usize, max_bytes: usize) -> Option<Announcement> {
        if self.window.is_empty() {
            return None;
        }
        let changes = std::mem::take(&mut self.window);
        let bytes: usize = changes
            .values()
            .map(|c| match c {
                Change::Joined(m) | Change::Left(m) => m.json_len(),
            })
            .sum();
        if changes.len() > max_diff || bytes > max_bytes {
            return Some(Announcement::Reset(presence::presence_reset_frame(ch)));
        }
        let mut changes: Vec<(MemberKey, Change)> = changes.into_iter().collect();
        changes.sort_by_key(|(k, _)| *k);
        let joins = changes.iter().filter_map(|(_, c)| if let Change::Joined(m) = c { Some(m) } else { None });
        let leaves = changes.iter().filter_map(|(_, c)| if let Change::Left(m) = c { Some(m) } else { None });
        Some(Announcement::Diff(presence::presence_diff_frame(ch, joins, leaves)))
    }
}

/// The presence of every presence channel homed on one core, and when their windows close.
#[derive(Debug, Default)]
pub struct Presences {
    channels: HashMap<Arc<str>, ChannelPresence>,
    /// Channels whose window is open, with the time (ms on the core's clock) it closes, in
    /// that order (every window is `presence.window_ms` long, so opening order is closing
    /// order).
    closing: VecDeque<(u64, Arc<str>)>,
    /// Members tracked, over every channel.
    members: usize,
}

impl Presences {
    /// The presence of `ch`, if it has any.
    pub fn get(&self, ch: &str) -> Option<&ChannelPresence> {
        self.channels.get(ch)
    }

    /// Members tracked on this core, over every channel.
    pub fn members(&self) -> usize {
        self.members
    }

    /// Applies `change` to the presence of `ch` at `now_ms`; opens a window closing at
    /// `now_ms + window_ms` when the change is the first of one. Returns the result of `change`
    /// and, when a window opened, when it closes.
    pub fn change<R>(
        &mut self,
        ch: &Arc<str>,
        now_ms: u64,
        window_ms: u64,
        change: impl FnOnce(&mut ChannelPresence) -> R,
    ) -> (R, Option<u64>) {
        let p = self.channels.entry(ch.clone()).or_default();
        let (was_open, before) = (p.has_changes(), p.len());
        let r = change(p);
        self.members = self.members + p.len() - before;
        let opened = (!was_open && p.has_changes()).then(|| now_ms + window_ms);
        if let Some(due) = opened {
            self.closing.push_back((due, ch.clone()));
        } else if p.is_idle() {
            self.channels.remove(ch);
        }
        (r, opened)
    }

    /// Up to `n` channels with the most members, most first (ties by name): one pass over the
    /// channels with a heap of at most `n` entries, for the status page.
    pub fn top(&self, n: usize) -> Vec<PresenceRow> {
        let mut heap: BinaryHeap<Reverse<(usize, &Arc<str>)>> = BinaryHeap::with_capacity(n.min(1024) + 1);
        for (ch, p) in self.channels.iter().filter(|(_, p)| !p.is_empty()) {
            heap.push(Reverse((p.len(), ch)));
            if heap.len() > n {
                heap.pop();
            }
        }
        heap.into_sorted_vec()
            .into_iter()
            .filter_map(|Reverse((_, ch))| {
                let (members, users) = self.channels.get(ch)?.stats();
                Some(PresenceRow { ch: ch.to_string(), members, users })
            })
            .collect()
    }

    /// When the next window closes (ms on the core's clock).
    pub fn next_due_ms(&self) -> Option<u64> {
        self.closing.front().map(|(due, _)| *due)
    }

    /// Closes every window due at `now_ms`, handing each channel and its frame to `announce`.
    pub fn close_due(
        &mut self,
        now_ms: u64,
        max_diff: usize,
        max_bytes: usize,
        mut announce: impl FnMut(&Arc<str>, Announcement),
    ) {
        while let Some((due, _)) = self.closing.front() {
            if *due > now_ms {
                break;
            }
            let Some((_, ch)) = self.closing.pop_front() else { break };
            let Some(p) = self.channels.get_mut(&ch) else { continue };
            if let Some(frame) = p.close_window(&ch, max_diff, max_bytes) {
                announce(&ch, frame);
            }
            if p.is_idle() {
                self.channels.remove(&ch);
            }
        }
        if self.closing.capacity() > 64 && self.closing.len() < self.closing.capacity() / 4 {
            self.closing.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(client: &str, user: Option<&str>) -> Member {
        Member { client: client.into(), user: user.map(Into::into), info: None }
    }

    fn text(frame: &Bytes) -> serde_json::Value {
        let (_, _, _, p) = crate::ws::codec::decode_server_frame(frame).unwrap().unwrap();
        serde_json::from_slice(&p).unwrap()
    }

    #[test]
    fn joins_and_leaves_of_one_window_coalesce_and_cancel() {
        let mut p = ChannelPresence::default();
        assert_eq!(p.join((0, 1, 1), m("a", Some("u1")), 10), Joined::Tracked);
        assert_eq!(p.join((0, 2, 1), m("b", Some("u1")), 10), Joined::Tracked);
        p.join((1, 1, 1), m("c", Some("u2")), 10);
        p.leave((1, 1, 1)); // joined and left within the window: never announced
        assert_eq!(p.stats(), (2, 1));
        let diff = text(p.close_window("room", 10, usize::MAX).expect("a diff").frame());
        assert_eq!(
            diff,
            serde_json::json!({"op":"presence_diff","ch":"room","joins":[{"client":"a","user":"u1"},{"client":"b","user":"u1"}],"leaves":[]})
        );
        assert!(p.close_window("room", 10, usize::MAX).is_none(), "nothing changed since");
        p.leave((0, 1, 1));
        p.join((0, 1, 1), m("a", Some("u1")), 10); // left and came back: nothing to say
        assert!(p.close_window("room", 10, usize::MAX).is_none());
        p.leave((0, 2, 1));
        let diff = text(p.close_window("room", 10, usize::MAX).expect("a diff").frame());
        assert_eq!(diff["leaves"], serde_json::json!([{"client":"b","user":"u1"}]));
        assert_eq!(p.stats(), (1, 1));
    }

    #[test]
    fn a_window_past_max_diff_is_a_reset() {
        let mut p = ChannelPresence::default();
        for i in 0..11 {
            p.join((0, i, 1), m(&format!("c{i}"), None), 100);
        }
        let reset = p.close_window("room", 10, usize::MAX).unwrap();
        assert!(matches!(reset, Announcement::Reset(_)));
        assert_eq!(text(reset.frame()), serde_json::json!({"op":"presence_reset","ch":"room"}));
        assert_eq!(p.stats(), (11, 0), "a reset changes nothing of who is there");
        // A window within max_diff whose diff would pass the byte bound is a reset too.
        for i in 11..14 {
            p.join((0, i, 1), m(&format!("c{i}"), None), 100);
        }
        let one = m("c11", None).json_len();
        assert!(matches!(p.close_window("room", 10, 3 * one - 1), Some(Announcement::Reset(_))));
        p.leave((0, 13, 1));
        assert!(matches!(p.close_window("room", 10, one), Some(Announcement::Diff(_))), "within both bounds");
    }

    #[test]
    fn members_past_the_maximum_are_untracked_and_leave_silently() {
        let mut p = ChannelPresence::default();
        assert_eq!(p.join((0, 1, 1), m("a", None), 1), Joined::Tracked);
        assert_eq!(p.join((0, 2, 1), m("b", None), 1), Joined::Untracked);
        p.close_window("room", 10, usize::MAX);
        p.leave((0, 2, 1));
        assert!(p.close_window("room", 10, usize::MAX).is_none(), "an untracked member's leave is not announced");
        p.leave((0, 1, 1));
        p.close_window("room", 10, usize::MAX);
        assert!(p.is_idle());
    }

    #[test]
    fn pages_follow_their_cursor_to_the_end() {
        let mut p = ChannelPresence::default();
        for i in 0..5 {
            p.join((0, i, 7), m(&format!("c{i}"), None), 100);
        }
        let (first, next) = p.page(None, 2, usize::MAX);
        assert_eq!(first.iter().map(|m| &*m.client).collect::<Vec<_>>(), ["c0", "c1"]);
        let next = parse_cursor(&next.expect("more"), 2).expect("a cursor");
        let (second, next) = p.page(Some(next), 2, usize::MAX);
        assert_eq!(second.iter().map(|m| &*m.client).collect::<Vec<_>>(), ["c2", "c3"]);
        let (last, next) = p.page(Some(parse_cursor(&next.unwrap(), 2).unwrap()), 2, usize::MAX);
        assert_eq!((last.len(), next), (1, None));
        // A byte bound ends a page early, with the cursor of what follows; one member at least.
        let one = m("c0", None).json_len();
        let (page, next) = p.page(None, 5, 2 * one);
        assert_eq!((page.len(), next.as_deref()), (2, Some("0-1-7")));
        assert_eq!(p.page(None, 5, 1).0.len(), 1, "a member larger than the bound still comes");
        for bad in ["1-2", "1-2-3-4", "a-2-3", "01-2-3", "1-02-3", "+1-2-3", "2-1-1", "1-4294967296-1", ""] {
            assert_eq!(parse_cursor(bad, 2), None, "{bad}");
        }
        assert_eq!(parse_cursor("1-4294967295-0", 2), Some((1, u32::MAX, 0)));
    }

    #[test]
    fn windows_close_in_order_and_idle_channels_are_forgotten() {
        let mut ps = Presences::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let (_, due) = ps.change(&a, 100, 500, |p| p.join((0, 1, 1), m("x", None), 10));
        assert_eq!(due, Some(600));
        let (_, due) = ps.change(&a, 200, 500, |p| p.join((0, 2, 1), m("y", None), 10));
        assert_eq!(due, None, "the window is already open");
        ps.change(&b, 300, 500, |p| p.join((0, 3, 1), m("z", None), 10));
        assert_eq!(ps.next_due_ms(), Some(600));
        let mut out = Vec::new();
        ps.close_due(700, 10, usize::MAX, |ch, _| out.push(ch.to_string()));
        assert_eq!(out, ["a"]);
        assert_eq!(ps.next_due_ms(), Some(800));
        ps.change(&b, 750, 500, |p| p.leave((0, 3, 1)));
        ps.close_due(800, 10, usize::MAX, |ch, _| out.push(ch.to_string()));
        assert_eq!(out, ["a"], "b's join and leave cancelled out");
        assert!(ps.get("b").is_none(), "an idle channel is forgotten");
        assert_eq!(ps.members(), 2);
    }

    #[test]
    fn top_lists_the_largest_channels_first_and_at_most_n() {
        let mut ps = Presences::default();
        for (ch, n) in [("one", 1u32), ("three", 3), ("two", 2), ("four", 4)] {
            let ch: Arc<str> = ch.into();
            for i in 0..n {
                ps.change(&ch, 0, 500, |p| p.join((0, i, 1), m(&format!("{ch}{i}"), Some("u")), 10));
            }
        }
        let row = |ch: &str, members| PresenceRow { ch: ch.into(), members, users: 1 };
        assert_eq!(ps.top(2), [row("four", 4), row("three", 3)]);
        assert_eq!(ps.top(10).len(), 4);
        assert!(ps.top(0).is_empty());
    }
}
