//! A subscriber with `tether-client`: prints every message of one channel as
//! `CH #SEQ DATA`, committing each after it is printed, and resumes by itself across
//! reconnects, server restarts and node changes (docs/clients.md).
//!
//! ```text
//! cargo run --release --example subscribe -- ws://127.0.0.1:8080/ws news [FROM]
//! ```
//!
//! With `FROM` (a seq) it starts after that seq from the channel's history (`0`: everything
//! still held); without it, with what is published from now on. Ctrl-C ends it.

use std::error::Error;
use std::io::Write;

use tether_client::{Client, ClientConfig, Event};

/// Subscribes to `ch` on `url` (one or several comma-separated `ws://` URLs) after seq `from`
/// (or live when `None`) and writes one `CH #SEQ DATA` line per message to `out` until `max`
/// messages were written. A reset (`evicted` or `epoch`: the resume point is gone) is written
/// as `CH reset at SEQ (REASON)`; a refusal ends the run with the server's error.
pub async fn run(url: &str, ch: &str, from: Option<u64>, max: u64, out: &mut impl Write) -> Result<(), Box<dyn Error>> {
    let mut client = Client::connect(ClientConfig::new(url))?;
    client.subscribe(ch, from)?;
    let mut written = 0;
    while written < max {
        match client.next_event().await? {
            Event::Message { ch, seq, data, .. } => {
                writeln!(out, "{ch} #{seq} {}", data.get())?;
                out.flush()?;
                // Recorded: a reconnect resumes after this seq, never before it.
                client.commit(&ch, seq).await?;
                written += 1;
            }
            Event::Reset { ch, seq, reason, .. } => writeln!(out, "{ch} reset at {seq} ({reason})")?,
            Event::Error { code, reason, .. } => return Err(format!("refused: {code}: {reason}").into()),
            Event::Disconnected { code, retry_in, .. } => {
                eprintln!("disconnected ({code:?}), reconnecting in {} ms", retry_in.as_millis())
            }
            _ => {}
        }
    }
    client.close().await;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(url), Some(ch)) = (args.first(), args.get(1)) else {
        return Err("usage: subscribe URL CHANNEL [FROM]".into());
    };
    let from = match args.get(2) {
        Some(f) => Some(f.parse().map_err(|e| format!("FROM {f:?} is not a seq: {e}"))?),
        None => None,
    };
    let mut stdout = std::io::stdout();
    tokio::select! {
        r = run(url, ch, from, u64::MAX, &mut stdout) => r,
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}
