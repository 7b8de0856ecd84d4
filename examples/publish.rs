//! A publisher with `tether-client`: publishes one JSON message `COUNT` times to a channel and
//! prints each ack as `CH #SEQ ID`. Every publish keeps its id until acked, so a reconnect in
//! between resends it and the server's dedup stores it once (docs/protocol.md, "pub").
//!
//! ```text
//! cargo run --release --example publish -- ws://127.0.0.1:8080/ws news '{"price":101.5}' [COUNT]
//! ```

use std::error::Error;
use std::io::Write;

use serde_json::value::RawValue;
use tether_client::{Client, ClientConfig};

/// Publishes `data` (JSON text) to `ch` on `url` `count` times, one after the other, and
/// writes one `CH #SEQ ID` line per ack to `out`. Data that is not JSON is refused before
/// connecting; a refusal from the server (`forbidden`, `limit`, …) ends the run with its error.
pub async fn run(url: &str, ch: &str, data: &str, count: u64, out: &mut impl Write) -> Result<(), Box<dyn Error>> {
    let data: Box<RawValue> = serde_json::from_str(data).map_err(|e| format!("DATA is not JSON ({e})"))?;
    let client = Client::connect(ClientConfig::new(url))?;
    for _ in 0..count {
        let ack = client.publish(ch, &data).await?;
        writeln!(out, "{} #{} {}", ack.ch, ack.seq, ack.id)?;
    }
    client.close().await;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(url), Some(ch), Some(data)) = (args.first(), args.get(1), args.get(2)) else {
        return Err("usage: publish URL CHANNEL JSON [COUNT]".into());
    };
    let count = match args.get(3) {
        Some(c) => c.parse().map_err(|e| format!("COUNT {c:?} is not a number: {e}"))?,
        None => 1,
    };
    run(url, ch, data, count, &mut std::io::stdout()).await
}
