//! Which close codes a client reconnects on (docs/protocol.md, close codes; codes from RFC 6455
//! §7.4.1 and the IANA WebSocket close code registry): the close contract of
//! [`tether_proto::protocol::close`], as the client uses it.

pub use tether_proto::protocol::close::{classify, classify_close, retry_hint, CloseAction, CloseCode};
