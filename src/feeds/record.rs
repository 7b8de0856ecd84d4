//! The feed record (DESIGN §6, §7 `[[feeds.static]]`): a definition written by an operator
//! ([`FeedDef`], `crate::config`'s) and the lease fields written by the lease store ([`Lease`]).

use serde::Serialize;

use crate::config::feed_def::{bad, quote};
pub use crate::config::feed_def::{
    validate_id, validate_pointer, validate_url, DesiredState, FeedDef, FeedError, MAX_ID_BYTES, MAX_TEXT_BYTES,
};

/// Longest `lease_owner` (a node id), in bytes.
pub const MAX_OWNER_BYTES: usize = 128;
/// Longest `last_seq` (an upstream sequence number or id, as text), in bytes.
pub const MAX_SEQ_BYTES: usize = 256;

/// The lease fields of a feed, written only by a [`crate::feeds::LeaseStore`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Lease {
    /// The node that holds or last held the lease; `None` if never acquired.
    pub lease_owner: Option<String>,
    /// When the lease ends, Unix epoch milliseconds of the holder's clock; 0 = free.
    pub lease_expires_at_ms: u64,
    /// Incremented by one on every acquire; 0 = never acquired.
    pub fencing_token: u64,
    /// The last upstream seq (or id) the holder stored with a renew or release.
    pub last_seq: Option<String>,
}

impl Lease {
    /// Whether someone holds the lease at `now_ms` (ms): `lease_expires_at_ms > now_ms`.
    pub fn is_held(&self, now_ms: u64) -> bool {
        self.lease_expires_at_ms > now_ms
    }
}

/// A feed: its definition and its lease. Serializes flat, as the admin API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Feed {
    /// What to connect to.
    #[serde(flatten)]
    pub def: FeedDef,
    /// Who holds it.
    #[serde(flatten)]
    pub lease: Lease,
}

/// Checks a node id used as `lease_owner`: 1–[`MAX_OWNER_BYTES`] printable ASCII bytes, no
/// space. Errors name `lease_owner`.
pub fn validate_owner(owner: &str) -> Result<(), FeedError> {
    if (1..=MAX_OWNER_BYTES).contains(&owner.len()) && owner.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(bad("lease_owner", format!("{} is not 1–{MAX_OWNER_BYTES} printable ASCII bytes", quote(owner))))
    }
}

/// Checks a `last_seq`: 1–[`MAX_SEQ_BYTES`] printable ASCII bytes, no space (it is
/// substituted into `subscribe` and a query string). Errors name `last_seq`.
pub fn validate_seq(seq: &str) -> Result<(), FeedError> {
    if (1..=MAX_SEQ_BYTES).contains(&seq.len()) && seq.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(bad("last_seq", format!("{} is not 1–{MAX_SEQ_BYTES} printable ASCII bytes", quote(seq))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def() -> FeedDef {
        FeedDef {
            id: "btc".into(),
            url: "wss://upstream.example/stream?x=1".into(),
            channel: "prices.btc".into(),
            desired_state: DesiredState::Started,
            subscribe: "{\"from\":{last_seq}}".into(),
            resume_query: "from".into(),
            seq_pointer: "/seq".into(),
        }
    }

    fn field_of(f: impl FnOnce(&mut FeedDef)) -> &'static str {
        let mut d = def();
        f(&mut d);
        d.validate().expect_err("must be refused").field
    }

    #[test]
    fn a_good_definition_passes() {
        def().validate().unwrap();
        let mut d = def();
        d.url = "ws://127.0.0.1:9000/".into();
        d.subscribe.clear();
        d.resume_query.clear();
        d.seq_pointer = "/a~1b/0/~0".into();
        d.validate().unwrap();
    }

    #[test]
    fn each_bad_field_is_named() {
        assert_eq!(field_of(|d| d.id = String::new()), "id");
        assert_eq!(field_of(|d| d.id = "a:b".into()), "id");
        assert_eq!(field_of(|d| d.id = "x".repeat(65)), "id");
        assert_eq!(field_of(|d| d.url = "http://h/".into()), "url");
        assert_eq!(field_of(|d| d.url = "ws:///path".into()), "url");
        assert_eq!(field_of(|d| d.url = "wss://h/#frag".into()), "url");
        assert_eq!(field_of(|d| d.url = "wss://h h/".into()), "url");
        assert_eq!(field_of(|d| d.channel = "a b".into()), "channel");
        assert_eq!(field_of(|d| d.channel = String::new()), "channel");
        assert_eq!(field_of(|d| d.resume_query = "a=b".into()), "resume_query");
        assert_eq!(field_of(|d| d.seq_pointer = "seq".into()), "seq_pointer");
        assert_eq!(field_of(|d| d.seq_pointer = String::new()), "seq_pointer");
        assert_eq!(field_of(|d| d.seq_pointer = "/a~2".into()), "seq_pointer");
        assert_eq!(field_of(|d| d.seq_pointer = "/a~".into()), "seq_pointer");
        assert_eq!(field_of(|d| d.subscribe = "x".repeat(MAX_TEXT_BYTES + 1)), "subscribe");
    }

    #[test]
    fn json_names_the_unknown_field_and_spells_the_state() {
        let e = serde_json::from_str::<FeedDef>(
            r#"{"id":"a","url":"ws://h/","channel":"c","seq_pointer":"/s","colour":"red"}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
        let d: FeedDef = serde_json::from_str(
            r#"{"id":"a","url":"ws://h/","channel":"c","seq_pointer":"/s","desired_state":"STOPPED"}"#,
        )
        .unwrap();
        assert_eq!(d.desired_state, DesiredState::Stopped);
        let f = Feed { def: d, lease: Lease::default() };
        let v = serde_json::to_value(&f).unwrap();
        assert_eq!(v["desired_state"], "STOPPED");
        assert_eq!(v["fencing_token"], 0);
        assert!(v["lease_owner"].is_null());
    }

    #[test]
    fn owner_and_seq_shapes() {
        validate_owner("node-1a2b").unwrap();
        assert_eq!(validate_owner("").unwrap_err().field, "lease_owner");
        assert_eq!(validate_owner("a b").unwrap_err().field, "lease_owner");
        validate_seq("12345").unwrap();
        assert_eq!(validate_seq("").unwrap_err().field, "last_seq");
        assert_eq!(validate_seq(&"9".repeat(MAX_SEQ_BYTES + 1)).unwrap_err().field, "last_seq");
    }
}
