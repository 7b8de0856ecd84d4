//! `tether sub` and `tether pub` (docs/clients.md, "Rust client and command-line tools"; docs/protocol.md),
//! and what every command shares: the URL argument, stderr lines, the end on a signal.

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::offsets::Position;
use super::session::{Client, SubscribeOptions};
use super::urls::check_urls;
use super::wire::check_channel;
use super::{Ack, ClientConfig, ClientError, Event, TokenSource};

/// Arguments of `tether sub URL CH [--from N] [--offset-file F] [--append-to F] [--join-leave]`.
#[derive(Debug, Clone)]
pub struct SubArgs {
    /// `ws://HOST:PORT/ws`, or several separated by commas (`ws://a/ws,ws://b/ws`): each
    /// reconnect goes to the next one ([`ClientConfig::urls`]).
    pub url: String,
    /// Channel to follow.
    pub channel: String,
    /// Last seq already processed (`0` replays from seq 1); used when neither the append file
    /// nor the offset file gives a position. `None`: start live.
    pub from: Option<u64>,
    /// Offset file: commits are written there (atomically, once per message) and read back at
    /// start. At-least-once: a crash between printing a line and its commit prints that one
    /// message again on restart.
    pub offset_file: Option<PathBuf>,
    /// Append messages to this file instead of stdout and resume from its last line's `seq`;
    /// writing the line is recording it, so a restart repeats nothing.
    pub append_to: Option<PathBuf>,
    /// The JWT for a server with `[auth]` (`--token`, `--token-file`; docs/security.md).
    pub token: Option<TokenSource>,
    /// Subscribe with `"join_leave": true` and print the channel's `presence_diff` and
    /// `presence_reset` lines on stdout beside the messages (`--join-leave`; with `append_to`,
    /// on stdout while the messages go to the file). The server refuses it with `presence_off`
    /// where the channel's rule has no `join_leave = true`.
    pub join_leave: bool,
}

/// Arguments of `tether pub URL CH JSON [--id ID]`.
#[derive(Debug, Clone)]
pub struct PubArgs {
    /// `ws://HOST:PORT/ws`, or several separated by commas, as [`SubArgs::url`].
    pub url: String,
    /// Channel to publish on.
    pub channel: String,
    /// The message's `data`, as JSON text.
    pub data: String,
    /// Publish id; a fresh random id when `None`. Reusing an id across runs makes a retried
    /// command idempotent within the server's dedup window.
    pub id: Option<String>,
    /// The JWT for a server with `[auth]`, as [`SubArgs::token`].
    pub token: Option<TokenSource>,
}

/// `tether sub`: prints each `msg` frame as one JSON line exactly as received
/// (`{"op":"msg","ch":…,"seq":…,"data":…}`) to stdout, or appends it to `append_to`; flushes;
/// only then commits. Resets and disconnects go to stderr as JSON lines. Reconnects and
/// resumes by itself and runs until SIGINT or SIGTERM, or until the server ends the
/// subscription (`POST /api/unsubscribe`, docs/api.md; its line goes to stderr): then `Ok`.
///
/// With `join_leave`, each `presence_diff` frame is printed on stdout as received, in order
/// with the messages, and each presence reset as `{"op":"presence_reset","ch":…}` — with
/// `"reconnected":true` added when the client raised it after a resubscription
/// ([`Event::PresenceReset`]).
///
/// With `append_to`, the file's last complete line gives the resume point; a torn last line
/// (no newline: the process was killed mid-write) is truncated away first. The epoch then comes
/// from `offset_file` when one is given.
///
/// # Errors
/// [`ClientError::InvalidUrl`] (naming the `URL` argument) and [`ClientError::InvalidChannel`]
/// before connecting; [`ClientError::Closed`] on a stop close code; [`ClientError::Refused`]
/// when the server refuses the subscription; [`ClientError::Io`] when output or the files fail;
/// [`ClientError::InvalidData`] when the append file's last line is not a `msg` object.
pub async fn run_sub(args: SubArgs) -> Result<(), ClientError> {
    run_sub_until(args, shutdown_signal()).await
}

/// `tether pub`: publishes once with a stable id, retrying across reconnects (with backoff)
/// until acked, and prints the `ack` frame as one JSON line on stdout.
///
/// # Errors
/// [`ClientError::InvalidData`] for data that is not JSON, [`ClientError::InvalidChannel`] and
/// [`ClientError::InvalidUrl`] (naming the `URL` argument), all before connecting; [`ClientError::Refused`] when the server refuses the publish;
/// [`ClientError::Closed`] on a stop close code.
pub async fn run_pub(args: PubArgs) -> Result<(), ClientError> {
    run_pub_until(args, shutdown_signal()).await
}

/// `run_pub` with the stop condition supplied by the caller: it ends the wait for the ack
/// (`Err(ClientError::Shutdown)`: the publish may or may not have been stored).
pub(super) async fn run_pub_until(args: PubArgs, shutdown: impl Future<Output = ()>) -> Result<(), ClientError> {
    let ack = tokio::select! {
        ack = publish_once(&args) => ack?,
        () = shutdown => return Err(ClientError::Shutdown),
    };
    let mut out = tokio::io::stdout();
    quiet_on_closed_pipe(write_line(&mut out, &ack.raw).await)
}

pub(super) async fn publish_once(args: &PubArgs) -> Result<Ack, ClientError> {
    let data: Box<RawValue> = serde_json::from_str(&args.data).map_err(|e| {
        let hint = if args.data.trim_start().starts_with(['{', '[', '"']) {
            ""
        } else {
            "; to send a string, quote it as JSON, e.g. '\"hello\"'"
        };
        ClientError::InvalidData(format!("DATA is not JSON: {e}{hint}"))
    })?;
    check_channel(&args.channel)?;
    let args = PubArgs { id: Some(args.id.clone().unwrap_or_else(super::new_publish_id)), ..args.clone() };
    publish_with(url_config(&args.url, args.token.clone())?, &args, &data).await
}

/// A write to a closed pipe (`tether sub … | head -1`) ends the command quietly: the reader
/// has all it wanted.
pub(super) fn quiet_on_closed_pipe(r: Result<(), ClientError>) -> Result<(), ClientError> {
    match r {
        Err(ClientError::Io(e)) if e.contains("Broken pipe") => Ok(()),
        other => other,
    }
}

/// Writes one line on stderr, ignoring a closed or failing stderr (never a panic, unlike
/// `eprintln!`).
pub fn notice(line: &str) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(line.as_bytes()).and_then(|()| err.write_all(b"\n"));
}

/// The defaults for a command's `URL` argument (one URL, or several separated by commas) and
/// its token.
pub(super) fn url_config(arg: &str, token: Option<TokenSource>) -> Result<ClientConfig, ClientError> {
    let mut cfg = ClientConfig::new(arg);
    check_urls(&cfg.urls, "URL")?;
    cfg.token = token;
    Ok(cfg)
}

/// Publishes and waits for the ack, writing every server answer met on the way (retries,
/// disconnects, reconnects, the refusal) as a JSON line on stderr ([`stderr_line`]).
pub(super) async fn publish_with(cfg: ClientConfig, args: &PubArgs, data: &RawValue) -> Result<Ack, ClientError> {
    let mut client = Client::connect(cfg)?;
    let publisher = client.publisher();
    let mut lines = Lines::default();
    let ack = async {
        let handle = publisher.send(&args.channel, args.id.clone(), data).await?;
        tokio::pin!(handle);
        loop {
            tokio::select! {
                ack = &mut handle => return ack,
                ev = client.next_event() => match ev {
                    Ok(ev) => lines.print(&ev),
                    Err(e) => return Err(e),
                },
            }
        }
    }
    .await;
    if let Err(ClientError::Refused { code, reason, .. }) = &ack {
        let (code, reason, id, ch) = (code.clone(), reason.clone(), args.id.clone(), Some(args.channel.clone()));
        lines.print(&Event::Error { code, reason, id, ch });
    }
    close_quickly(client).await;
    ack
}

/// How long a command waits for the server's close reply at its end (SIGINT / SIGTERM
/// included), so that it exits within 200 ms.
const CLOSE_BOUND: std::time::Duration = std::time::Duration::from_millis(150);

pub(super) async fn close_quickly(client: Client) {
    let _ = tokio::time::timeout(CLOSE_BOUND, client.close()).await;
}

/// Which stderr lines a command prints: every event [`stderr_line`] renders, except the
/// first `connected`: one is printed for every connection after a disconnect (where the
/// client resumed).
#[derive(Default)]
pub(super) struct Lines {
    disconnected: bool,
}

impl Lines {
    pub(super) fn print(&mut self, ev: &Event) {
        match ev {
            Event::Connected { .. } if !self.disconnected => return,
            Event::Connected { .. } => self.disconnected = false,
            Event::Disconnected { .. } => self.disconnected = true,
            _ => {}
        }
        if let Some(line) = stderr_line(ev) {
            notice(&line);
        }
    }
}

pub(super) async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

pub(super) async fn write_line<W: AsyncWrite + Unpin + ?Sized>(out: &mut W, text: &str) -> Result<(), ClientError> {
    let mut line = Vec::with_capacity(text.len() + 1);
    line.extend_from_slice(text.as_bytes());
    line.push(b'\n');
    // One write per line, so a kill leaves at most one torn line at the end.
    out.write_all(&line).await?;
    out.flush().await?;
    Ok(())
}

/// `run_sub` with the stop condition and the client configuration supplied by the caller.
pub(super) async fn run_sub_until(args: SubArgs, shutdown: impl Future<Output = ()>) -> Result<(), ClientError> {
    let mut cfg = url_config(&args.url, args.token.clone())?;
    cfg.offset_file = args.offset_file.clone();
    run_sub_with(cfg, args, shutdown).await
}

pub(super) async fn run_sub_with(
    cfg: ClientConfig,
    args: SubArgs,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ClientError> {
    check_channel(&args.channel)?;
    let mut file_last = None;
    let mut out: Box<dyn AsyncWrite + Unpin + Send> = match &args.append_to {
        Some(path) => {
            let scan = path.clone();
            file_last = tokio::task::spawn_blocking(move || recover_append_file(&scan))
                .await
                .map_err(|e| ClientError::Io(e.to_string()))??;
            let file = tokio::fs::OpenOptions::new().append(true).create(true).open(path).await?;
            Box::new(file)
        }
        None => Box::new(tokio::io::stdout()),
    };
    let mut client = Client::connect(cfg)?;
    let ch = args.channel.as_str();
    let mut opts = SubscribeOptions { from: args.from, join_leave: args.join_leave, ..SubscribeOptions::default() };
    if let Some(seq) = file_last {
        opts.at = Some(Position { seq, epoch: client.position(ch).and_then(|p| p.epoch) });
    }
    client.subscribe_with(ch, opts)?;
    // Presence lines go with the messages, or to stdout when the messages go to a file.
    let mut side: Option<tokio::io::Stdout> = args.append_to.as_ref().map(|_| tokio::io::stdout());
    tokio::pin!(shutdown);
    let mut lines = Lines::default();
    let result = loop {
        let ev = tokio::select! {
            () = &mut shutdown => break Ok(()),
            ev = client.next_event() => ev,
        };
        match ev {
            Ok(Event::Message { ch, seq, raw, .. }) => {
                if let Err(e) = write_line(&mut out, &raw).await {
                    break quiet_on_closed_pipe(Err(e));
                }
                if let Err(e) = client.commit(&ch, seq).await {
                    break Err(e);
                }
            }
            Ok(ev @ (Event::PresenceDiff { .. } | Event::PresenceReset { .. })) => {
                let out: &mut (dyn AsyncWrite + Unpin + Send) = match side.as_mut() {
                    Some(s) => s,
                    None => &mut out,
                };
                if let Err(e) = write_line(out, &presence_line(ev)).await {
                    break quiet_on_closed_pipe(Err(e));
                }
            }
            Ok(Event::Error { code, reason, id, ch }) => {
                lines.print(&Event::Error { code: code.clone(), reason: reason.clone(), id, ch });
                break Err(ClientError::Refused { code, reason, retry_after: None });
            }
            // The server ended the one subscription: nothing more comes.
            Ok(ev @ Event::Unsubscribed { .. }) => {
                lines.print(&ev);
                break Ok(());
            }
            Ok(ev) => lines.print(&ev),
            Err(e) => break Err(e),
        }
    };
    close_quickly(client).await;
    result
}

/// The stdout line of `tether sub --join-leave` for a presence event: a `presence_diff` frame
/// as received, or `{"op":"presence_reset","ch":CH}` as the server sends it, with
/// `"reconnected":true` for the client's own reset after a resubscription.
fn presence_line(ev: Event) -> String {
    #[derive(Serialize)]
    struct Reset<'a> {
        op: &'static str,
        ch: &'a str,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        reconnected: bool,
    }
    match ev {
        Event::PresenceDiff { raw, .. } => raw,
        Event::PresenceReset { ch, reconnected } => {
            serde_json::to_string(&Reset { op: "presence_reset", ch: &ch, reconnected }).unwrap_or_default()
        }
        _ => String::new(),
    }
}

/// The JSON line `tether sub` and `tether pub` write on stderr for a reset, a refusal, a
/// request the client retries, a disconnect and a connection, with its keys in the order of
/// the wire protocol (docs/protocol.md), e.g.
/// `{"op":"reset","ch":"news","seq":42,"epoch":"…","reason":"epoch","oldest":1}`,
/// `{"op":"error","code":"forbidden","reason":"…","id":null,"ch":"admin.x"}`,
/// `{"op":"unsubscribed","ch":"news","reason":"server"}`,
/// `{"event":"retrying","code":"unavailable","reason":"…","id":"p1","ch":"news","retry_in_ms":1000}`,
/// `{"event":"disconnected","code":1012,"reason":"…","retry_in_ms":850}` and
/// `{"event":"connected","url":"ws://b:8080/ws"}`. `None` for events that print nothing.
pub(super) fn stderr_line(ev: &Event) -> Option<String> {
    #[derive(Serialize)]
    struct Reset<'a> {
        op: &'static str,
        ch: &'a str,
        seq: u64,
        epoch: &'a str,
        reason: &'a str,
        oldest: u64,
    }
    #[derive(Serialize)]
    struct Disconnected<'a> {
        event: &'static str,
        code: Option<u16>,
        reason: &'a str,
        retry_in_ms: u64,
    }
    #[derive(Serialize)]
    struct Refused<'a> {
        op: &'static str,
        code: &'a str,
        reason: &'a str,
        id: Option<&'a str>,
        ch: Option<&'a str>,
    }
    #[derive(Serialize)]
    struct Retrying<'a> {
        event: &'static str,
        code: &'a str,
        reason: &'a str,
        id: Option<&'a str>,
        ch: Option<&'a str>,
        retry_in_ms: u64,
    }
    #[derive(Serialize)]
    struct Connected<'a> {
        event: &'static str,
        url: &'a str,
    }
    #[derive(Serialize)]
    struct Unsubscribed<'a> {
        op: &'static str,
        ch: &'a str,
        reason: &'static str,
    }
    let ms = |d: &std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let text = match ev {
        Event::Reset { ch, seq, epoch, reason, oldest } => {
            serde_json::to_string(&Reset { op: "reset", ch, seq: *seq, epoch, reason, oldest: *oldest })
        }
        Event::Disconnected { code, reason, retry_in } => serde_json::to_string(&Disconnected {
            event: "disconnected",
            code: *code,
            reason,
            retry_in_ms: ms(retry_in),
        }),
        Event::Error { code, reason, id, ch } => {
            serde_json::to_string(&Refused { op: "error", code, reason, id: id.as_deref(), ch: ch.as_deref() })
        }
        Event::Retrying { code, reason, id, ch, retry_in } => serde_json::to_string(&Retrying {
            event: "retrying",
            code,
            reason,
            id: id.as_deref(),
            ch: ch.as_deref(),
            retry_in_ms: ms(retry_in),
        }),
        Event::Connected { url } => serde_json::to_string(&Connected { event: "connected", url }),
        Event::Unsubscribed { ch } => serde_json::to_string(&Unsubscribed { op: "unsubscribed", ch, reason: "server" }),
        _ => return None,
    };
    text.ok()
}

/// Makes the append file end on a complete line and returns the `seq` of its last line
/// (`None` for a missing or empty file). Bytes after the last newline are a line torn by a
/// kill mid-write: they are truncated away (and the truncation fsynced) so appending continues
/// on a clean line.
///
/// # Errors
/// I/O errors; `InvalidData` when the last complete line is not a JSON object with an integer
/// `seq` (the file is not a `tether sub` output, or is corrupt).
pub(super) fn recover_append_file(path: &Path) -> io::Result<Option<u64>> {
    let mut file = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let (end, last_line) = last_line(&mut file, len)?;
    if end < len {
        file.set_len(end)?;
        file.sync_all()?;
    }
    let Some(line) = last_line else {
        return Ok(None);
    };
    #[derive(Deserialize)]
    struct Line {
        seq: u64,
    }
    let parsed: Line = serde_json::from_slice(&line).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: last line is not a msg with a seq: {e}", path.display()),
        )
    })?;
    Ok(Some(parsed.seq))
}

/// Scans backwards from `len`: returns the length up to and including the last newline, and
/// the last non-empty complete line, reading only as much of the file's tail as needed.
fn last_line(file: &mut File, len: u64) -> io::Result<(u64, Option<Vec<u8>>)> {
    const CHUNK: u64 = 64 * 1024;
    let mut tail: Vec<u8> = Vec::new();
    let mut start = len;
    let mut end: Option<u64> = None;
    loop {
        let from = start.saturating_sub(CHUNK);
        let mut chunk = vec![0; usize::try_from(start - from).unwrap_or(0)];
        file.seek(SeekFrom::Start(from))?;
        file.read_exact(&mut chunk)?;
        chunk.extend_from_slice(&tail);
        tail = chunk;
        start = from;
        let end_in_tail = match end {
            Some(e) => usize::try_from(e - start).unwrap_or(0),
            None => match tail.iter().rposition(|&b| b == b'\n') {
                Some(i) => {
                    end = Some(start + i as u64 + 1);
                    i + 1
                }
                None if start == 0 => return Ok((0, None)),
                None => continue,
            },
        };
        let body = &tail[..end_in_tail];
        let trimmed_end = body.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(0, |i| i + 1);
        let content = &body[..trimmed_end];
        if let Some(i) = content.iter().rposition(|&b| b == b'\n') {
            return Ok((start + end_in_tail as u64, Some(content[i + 1..].to_vec())));
        }
        if start == 0 {
            let line = (!content.is_empty()).then(|| content.to_vec());
            return Ok((end_in_tail as u64, line));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn temp_file(name: &str, content: &[u8]) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("tether-append-{name}-{}-{}", std::process::id(), rand::random::<u32>()));
        fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("out.jsonl");
        fs::write(&path, content).expect("write");
        path
    }

    fn msg(seq: u64) -> String {
        format!("{{\"op\":\"msg\",\"ch\":\"c\",\"seq\":{seq},\"data\":{{\"n\":{seq}}}}}\n")
    }

    #[test]
    fn missing_and_empty_files() {
        let path = temp_file("empty", b"");
        assert_eq!(recover_append_file(&path).expect("empty"), None);
        assert_eq!(recover_append_file(&path.with_file_name("nope")).expect("missing"), None);
    }

    #[test]
    fn last_complete_line_gives_seq() {
        let content = format!("{}{}{}", msg(1), msg(2), msg(3));
        let path = temp_file("complete", content.as_bytes());
        assert_eq!(recover_append_file(&path).expect("ok"), Some(3));
        assert_eq!(fs::read_to_string(&path).expect("read"), content);
    }

    #[test]
    fn torn_line_is_truncated() {
        let good = format!("{}{}", msg(1), msg(2));
        let torn = format!("{good}{{\"op\":\"msg\",\"ch\":\"c\",\"se");
        let path = temp_file("torn", torn.as_bytes());
        assert_eq!(recover_append_file(&path).expect("ok"), Some(2));
        assert_eq!(fs::read_to_string(&path).expect("read"), good);
    }

    #[test]
    fn only_a_torn_line() {
        let path = temp_file("only-torn", b"{\"op\":\"msg\",\"seq\":1");
        assert_eq!(recover_append_file(&path).expect("ok"), None);
        assert_eq!(fs::read(&path).expect("read"), b"");
    }

    #[test]
    fn single_line_and_blank_lines() {
        let path = temp_file("single", msg(7).as_bytes());
        assert_eq!(recover_append_file(&path).expect("ok"), Some(7));
        let path = temp_file("blank", format!("{}\n\n", msg(8)).as_bytes());
        assert_eq!(recover_append_file(&path).expect("ok"), Some(8));
    }

    #[test]
    fn long_file_reads_only_the_tail() {
        let mut content = String::new();
        for seq in 1..=5000 {
            content.push_str(&msg(seq));
        }
        // A last line longer than one read chunk.
        let big = format!("{{\"op\":\"msg\",\"ch\":\"c\",\"seq\":5001,\"data\":\"{}\"}}\n", "x".repeat(200_000));
        content.push_str(&big);
        content.push_str("{\"op\":\"msg\",\"ch\":\"c\",\"seq\":50");
        let path = temp_file("long", content.as_bytes());
        assert_eq!(recover_append_file(&path).expect("ok"), Some(5001));
        assert!(fs::read_to_string(&path).expect("read").ends_with("\"}\n"));
    }

    #[test]
    fn corrupt_last_line_is_an_error() {
        let path = temp_file("corrupt", format!("{}not json\n", msg(1)).as_bytes());
        let err = recover_append_file(&path).expect_err("corrupt");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[tokio::test]
    async fn bad_json_fails_before_connecting() {
        let args = PubArgs {
            url: "ws://127.0.0.1:1/ws".into(),
            channel: "c".into(),
            data: "{not json".into(),
            id: None,
            token: None,
        };
        let err = publish_once(&args).await.expect_err("bad json");
        assert!(matches!(err, ClientError::InvalidData(_)), "{err:?}");
        let args = PubArgs { data: "1".into(), channel: "bad name".into(), ..args };
        let err = publish_once(&args).await.expect_err("bad channel");
        assert!(matches!(err, ClientError::InvalidChannel(_)), "{err:?}");
        for (url, want) in [
            ("", "URL has an empty entry"),
            ("ws://127.0.0.1:1/ws,", "URL entry 2 of 2: URL has an empty entry"),
            ("ws://127.0.0.1:1/ws,http://127.0.0.1:2/ws", "URL entry 2 of 2: http://127.0.0.1:2/ws: expected"),
        ] {
            let args = PubArgs { url: url.into(), channel: "c".into(), ..args.clone() };
            match publish_once(&args).await {
                Err(ClientError::InvalidUrl(e)) => assert!(e.starts_with(want), "{url:?}: {e}"),
                other => panic!("{url:?}: {other:?}"),
            }
        }
    }
}
