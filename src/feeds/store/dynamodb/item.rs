//! The DynamoDB item of a feed, and short error messages for failed SDK calls.
//!
//! One item per feed, hash key `id` (S). The definition fields are S (`subscribe` and
//! `resume_query` may be the empty string), `lease_expires_at_ms` and `fencing_token` are N,
//! `lease_owner` and `last_seq` are S and absent when there is none. `last_seq` is S because
//! an upstream seq may be any id, not only a number.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::AttributeValue;

use crate::feeds::record::{DesiredState, Feed, FeedDef, Lease};
use crate::feeds::store::LeaseError;

/// A DynamoDB item: attribute name → value.
pub(super) type Item = HashMap<String, AttributeValue>;

/// The hash key attribute (S).
pub(super) const ID: &str = "id";
/// Lease attributes written only by the lease store.
pub(super) const OWNER: &str = "lease_owner";
pub(super) const EXPIRES: &str = "lease_expires_at_ms";
pub(super) const TOKEN: &str = "fencing_token";
pub(super) const LAST_SEQ: &str = "last_seq";

/// The definition attributes `put` writes, in [`def_values`] order.
pub(super) const DEF_FIELDS: [&str; 6] =
    ["url", "channel", "desired_state", "subscribe", "resume_query", "seq_pointer"];

/// A string attribute.
pub(super) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

/// A number attribute, in decimal (DynamoDB numbers hold 38 digits: a u64 is exact).
pub(super) fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// The key of feed `id`.
pub(super) fn key(id: &str) -> Item {
    HashMap::from([(ID.to_owned(), s(id))])
}

/// The values of [`DEF_FIELDS`] for `def`.
pub(super) fn def_values(def: &FeedDef) -> [AttributeValue; 6] {
    [
        s(&def.url),
        s(&def.channel),
        s(def.desired_state.as_str()),
        s(&def.subscribe),
        s(&def.resume_query),
        s(&def.seq_pointer),
    ]
}

fn corrupt(id: &str, name: &str, what: &str) -> LeaseError {
    LeaseError::Store(format!("feed {id}: stored {name} {what}"))
}

/// The S attribute `name`: `None` when absent, an error when of another type.
fn opt_text(item: &Item, id: &str, name: &str) -> Result<Option<String>, LeaseError> {
    match item.get(name) {
        None | Some(AttributeValue::Null(_)) => Ok(None),
        Some(AttributeValue::S(v)) => Ok(Some(v.clone())),
        Some(_) => Err(corrupt(id, name, "is not a string (S)")),
    }
}

/// The N attribute `name` as a u64; 0 when absent.
fn num(item: &Item, id: &str, name: &str) -> Result<u64, LeaseError> {
    match item.get(name) {
        None | Some(AttributeValue::Null(_)) => Ok(0),
        Some(AttributeValue::N(v)) => v.parse().map_err(|_| corrupt(id, name, &format!("{v:?} is not a u64"))),
        Some(_) => Err(corrupt(id, name, "is not a number (N)")),
    }
}

/// The feed id of an item, if it has a string `id`.
pub(super) fn item_id(item: &Item) -> Option<&str> {
    match item.get(ID) {
        Some(AttributeValue::S(id)) => Some(id),
        _ => None,
    }
}

/// The lease fields of an item (the whole item is returned by a failed condition check).
pub(super) fn lease_of(item: &Item, id: &str) -> Result<Lease, LeaseError> {
    Ok(Lease {
        lease_owner: opt_text(item, id, OWNER)?,
        lease_expires_at_ms: num(item, id, EXPIRES)?,
        fencing_token: num(item, id, TOKEN)?,
        last_seq: opt_text(item, id, LAST_SEQ)?,
    })
}

/// Builds the feed of an item read from the table. Errors: [`LeaseError::Store`] naming the
/// feed and the attribute when an attribute has the wrong type or value (an item written by
/// something else than this store).
pub(super) fn feed_of(item: &Item) -> Result<Feed, LeaseError> {
    let id = item_id(item).ok_or_else(|| LeaseError::Store("an item without a string id".into()))?;
    let mut text = DEF_FIELDS.iter().map(|name| opt_text(item, id, name).map(Option::unwrap_or_default));
    let mut next = || text.next().unwrap_or(Ok(String::new()));
    let (url, channel, state) = (next()?, next()?, next()?);
    let (subscribe, resume_query, seq_pointer) = (next()?, next()?, next()?);
    let desired_state =
        DesiredState::parse(&state).ok_or_else(|| corrupt(id, "desired_state", &format!("{state:?}")))?;
    Ok(Feed {
        def: FeedDef { id: id.to_owned(), url, channel, desired_state, subscribe, resume_query, seq_pointer },
        lease: lease_of(item, id)?,
    })
}

/// Longest error text quoted from the SDK or the server, in bytes.
const MAX_ERR_BYTES: usize = 200;

fn clip(mut t: String) -> String {
    if t.len() > MAX_ERR_BYTES {
        let mut end = MAX_ERR_BYTES;
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        t.truncate(end);
        t.push('…');
    }
    t
}

/// The innermost cause of an error: for a failed connection, the OS error ("Connection
/// refused (os error 111)") rather than the layers of client wrappers around it.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// Maps a failed SDK call to [`LeaseError::Store`] with one short line: the operation, then
/// the service's error code and message, a timeout with its bound, or the root cause of a
/// connection failure; never the SDK's whole debug dump.
pub(super) fn sdk_err<E, R>(op: &str, timeout_ms: u64, e: SdkError<E, R>) -> LeaseError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    let what = match &e {
        SdkError::ServiceError(se) => {
            let err = se.err();
            format!("{}: {}", err.code().unwrap_or("service error"), err.message().unwrap_or("(no message)"))
        }
        SdkError::TimeoutError(_) => format!("no answer within {timeout_ms} ms"),
        SdkError::DispatchFailure(d) if d.is_timeout() => format!("no answer within {timeout_ms} ms"),
        SdkError::DispatchFailure(_) => format!("cannot reach DynamoDB: {}", root_cause(&e)),
        SdkError::ResponseError(_) => format!("unreadable response: {}", root_cause(&e)),
        SdkError::ConstructionFailure(_) => format!("request not sent: {}", root_cause(&e)),
        _ => root_cause(&e),
    };
    LeaseError::Store(clip(format!("DynamoDB {op}: {what}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(pairs: &[(&str, AttributeValue)]) -> Item {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()
    }

    fn full() -> Item {
        let def = FeedDef {
            id: "btc".into(),
            url: "wss://up.example/s".into(),
            channel: "prices.btc".into(),
            desired_state: DesiredState::Stopped,
            subscribe: String::new(),
            resume_query: "from".into(),
            seq_pointer: "/seq".into(),
        };
        let mut it = key(&def.id);
        it.extend(DEF_FIELDS.iter().map(|f| (*f).to_owned()).zip(def_values(&def)));
        it.insert(TOKEN.into(), n(7));
        it.insert(EXPIRES.into(), n(u64::MAX));
        it.insert(OWNER.into(), s("node-a"));
        it.insert(LAST_SEQ.into(), s("abc-12"));
        it
    }

    #[test]
    fn an_item_reads_back_as_the_feed() {
        let f = feed_of(&full()).unwrap();
        assert_eq!(f.def.id, "btc");
        assert_eq!(f.def.desired_state, DesiredState::Stopped);
        assert_eq!(f.def.subscribe, "");
        assert_eq!(f.lease.fencing_token, 7);
        assert_eq!(f.lease.lease_expires_at_ms, u64::MAX, "a u64 round-trips exactly through N");
        assert_eq!(f.lease.lease_owner.as_deref(), Some("node-a"));
        assert_eq!(f.lease.last_seq.as_deref(), Some("abc-12"));
    }

    #[test]
    fn a_fresh_item_has_no_lease() {
        let mut it = full();
        for k in [OWNER, EXPIRES, TOKEN, LAST_SEQ] {
            it.remove(k);
        }
        assert_eq!(feed_of(&it).unwrap().lease, Lease::default());
    }

    #[test]
    fn a_corrupt_item_names_the_feed_and_attribute() {
        let msg = |it: Item| match feed_of(&it) {
            Err(LeaseError::Store(m)) => m,
            other => panic!("{other:?}"),
        };
        let mut it = full();
        it.insert(TOKEN.into(), s("7"));
        assert!(msg(it).contains("btc: stored fencing_token is not a number"));
        let mut it = full();
        it.insert(EXPIRES.into(), AttributeValue::N("-1".into()));
        assert!(msg(it).contains("lease_expires_at_ms \"-1\" is not a u64"));
        let mut it = full();
        it.insert("desired_state".into(), s("RUNNING"));
        assert!(msg(it).contains("desired_state \"RUNNING\""));
        assert!(msg(item(&[("url", s("x"))])).contains("without a string id"));
    }

    #[test]
    fn long_messages_are_clipped_on_a_char_boundary() {
        let t = clip("é".repeat(300));
        assert!(t.len() <= MAX_ERR_BYTES + '…'.len_utf8());
        assert!(t.ends_with('…'));
    }
}
