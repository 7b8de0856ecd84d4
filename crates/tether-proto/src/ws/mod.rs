//! RFC 6455 building blocks, sans-IO: nothing here touches a socket or a clock.

pub mod codec;
pub mod deflate;
pub mod handshake;
