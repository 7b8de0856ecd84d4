//! Command-line arguments of `tether load` (docs/benchmarks.md, "The load generator": the flags
//! are a stable interface) and the parsers for their values: durations (`30s`), source-address
//! ranges (`127.0.0.2-127.0.0.254`) and `ws://` / `wss://` URLs.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;
pub use tether_proto::duration::parse_duration;

use crate::tls::TlsTarget;

/// Options every scenario shares: thread count, handshake concurrency, source addresses and
/// the hidden child-process flags used by `--procs`.
#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// Worker threads in this process (each runs a single-threaded tokio runtime); 0 = one per
    /// available CPU.
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Largest number of handshakes in flight at once in this process. Unbounded bursts
    /// overflow the server's accept backlog and turn into 1 s SYN retransmits.
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// Source addresses to bind before connecting, spread round-robin over connections:
    /// comma-separated IPv4 addresses or inclusive ranges `A-B`, e.g. `127.0.0.2-127.0.0.254`.
    /// Each source address has its own ephemeral port range, so the port range stops being
    /// the limit (all of 127.0.0.0/8 is loopback on Linux).
    #[arg(long, alias = "source", value_parser = parse_sources)]
    pub sources: Option<Sources>,
    /// PEM file of the CA certificates to trust for `wss://` and `https://` URLs (e.g. a test
    /// CA); default the system bundle, /etc/ssl/certs/ca-certificates.crt.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Hidden: this process is child `i` of a `--procs` run (0-based).
    #[arg(long, hide = true)]
    pub child_index: Option<usize>,
    /// Hidden: the number of processes of the `--procs` run this child belongs to.
    #[arg(long, hide = true)]
    pub child_of: Option<usize>,
}

/// `tether load idle`: open N connections, subscribe each to one of K channels, hold them.
#[derive(Debug, Clone, clap::Args)]
pub struct IdleArgs {
    /// Server URLs (`ws://host:port/ws`, or `wss://` over TLS); connections are spread
    /// round-robin over them.
    #[arg(required = true, num_args = 1..)]
    pub urls: Vec<String>,
    /// Connections to open in total (over all processes).
    #[arg(long)]
    pub conns: usize,
    /// Processes to run (this one re-executes itself P times, each child taking 1/P of the
    /// connections) to get past the per-process open-file limit.
    #[arg(long, default_value_t = 1)]
    pub procs: usize,
    /// New connections per second in total; 0 = as fast as `--concurrency` allows.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Channels the connections subscribe to (connection i subscribes to `load.idle.{i % K}`).
    #[arg(long, default_value_t = 1)]
    pub channels: usize,
    /// How long to hold the connections once all are open, e.g. `30s`, `500ms`, `2m`.
    /// SIGTERM or SIGINT ends the hold early (the report is still printed).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub hold: Duration,
    /// Measure broadcast latency: each `msg` whose `data` carries `{"t": UNIX_NS}` (its publish
    /// time) is timed on arrival, per seq, over every held connection; the report gains
    /// `broadcast_received`, `broadcasts` (per seq: `received`, `p50_ms`, `p99_ms`, `max_ms`) and
    /// `broadcast_hist` (crates/tether-load/src/broadcast.rs). At the end of the hold each connection closes
    /// with 1000 and is read until the server's close (at most 10 s), so every broadcast the
    /// server queued before the stop is counted.
    #[arg(long)]
    pub latency_from_data: bool,
    /// Offer permessage-deflate (RFC 7692, no context takeover either way) on every
    /// connection; the report's `deflate_agreed` counts the connections that got it.
    #[arg(long)]
    pub deflate: bool,
    /// Options shared by every scenario.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// How `fanout` publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PublishVia {
    /// `{"op":"pub"}` on one extra WebSocket connection, acks read as they come.
    Ws,
    /// `POST /publish/{ch}` on one keep-alive HTTP/1.1 connection, one request at a time.
    Http,
}

/// What `fanout` publishes as each message's `data` (every shape carries the stamp `"t"`, `"k"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Payload {
    /// The stamp padded with `x` to `--size` bytes (compresses to almost nothing).
    #[default]
    Pad,
    /// An order-book snapshot: symbol, then `bids` and `asks` as `["price","qty"]` string
    /// pairs around a drifting mid, levels added until `--size` bytes, most one tick (a cent)
    /// from the next as at the top of a liquid book; prices and quantities differ in every
    /// message (JSON as exchanges send it).
    Book,
    /// One trade: symbol, price, quantity, side, trade id; about 120 bytes (`--size` unused).
    Tick,
}

/// `tether load fanout`: N subscribers, M stamped messages per second of S bytes.
#[derive(Debug, Clone, clap::Args)]
pub struct FanoutArgs {
    /// Server URLs (`ws://host:port/ws`, or `wss://` over TLS; with `--sse`, `https://host:port/`
    /// works too); subscriber i connects to URL `i % U`, so with the nodes of a multi-node
    /// broker (Redis) the subscribers are spread over the nodes.
    #[arg(required = true, num_args = 1..)]
    pub urls: Vec<String>,
    /// Where the publisher connects; default the first URL. With a multi-node broker, a
    /// publisher on another node than (some of) the subscribers measures the cross-node path.
    #[arg(long)]
    pub publish_url: Option<String>,
    /// Subscribers (connection i subscribes to channel `i % K`).
    #[arg(long)]
    pub subs: usize,
    /// Messages published per second, in total over all channels (round-robin).
    #[arg(long)]
    pub rate: f64,
    /// Size of each message's `data` JSON in bytes (padded; at least the ~40-byte stamp).
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Shape of each message's `data`.
    #[arg(long, value_enum, default_value_t = Payload::Pad)]
    pub payload: Payload,
    /// Offer permessage-deflate (`client_no_context_takeover; server_no_context_takeover`, RFC
    /// 7692) on every subscriber's handshake and inflate the compressed messages; the report
    /// says how many agreed. Not with `--sse`.
    #[arg(long)]
    pub deflate: bool,
    /// How long to publish, e.g. `10s`.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Duration,
    /// Channels (named `load.fanout.{run}.{k}`, `run` random per invocation).
    #[arg(long, default_value_t = 1)]
    pub channels: usize,
    /// Publish path.
    #[arg(long, value_enum, default_value_t = PublishVia::Ws)]
    pub publish: PublishVia,
    /// Raw mode for any RFC 6455 server: each subscriber sends TEXT as one text frame after the
    /// handshake (nothing when empty), then counts and timestamps every data frame it receives
    /// (latency from a `"t":NS` in the payload when present; order from `"k":N`). With a
    /// non-zero `--rate` an extra connection sends the stamped payloads as text frames.
    #[arg(long)]
    pub raw: Option<String>,
    /// Longest wait after the last publish for deliveries to arrive, e.g. `5s`.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub grace: Duration,
    /// Extra subscribers that complete the handshake, subscribe (non-reader j to channel `j % K`)
    /// and then never read: slow consumers (docs/operations.md, slow subscribers). They are left
    /// out of the latency, delivery and loss figures; the report says how many the server closed,
    /// with which code. Not in raw mode.
    #[arg(long, default_value_t = 0)]
    pub non_readers: usize,
    /// Subscribe over Server-Sent Events (`GET /sse?ch=…` on the URL's server) instead of
    /// WebSockets; the publisher is unchanged. Not with `--raw` or `--non-readers`.
    #[arg(long)]
    pub sse: bool,
    /// `SO_RCVBUF` of each non-reader in bytes, set before connect so the advertised window
    /// stays small (the kernel doubles the value and enforces a floor).
    #[arg(long, default_value_t = 4096)]
    pub non_reader_rcvbuf: u32,
    /// MSS each non-reader announces (`TCP_MAXSEG` before connect), in bytes; 0 leaves the
    /// kernel's. The default, Ethernet's 1460, keeps the server's kernel send buffer for a
    /// non-reader as small as on a real network path: with loopback's 64 KiB MSS it grows to
    /// MiBs, and the server's own queue limit is reached only after that much more data.
    #[arg(long, default_value_t = 1460)]
    pub non_reader_mss: u32,
    /// Options shared by every scenario.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `tether load publish`: acknowledged publishes per second from P publisher connections.
#[derive(Debug, Clone, clap::Args)]
pub struct PublishArgs {
    /// Server URL (`ws://host:port/ws`, or `wss://` over TLS).
    pub url: String,
    /// Publisher connections.
    #[arg(long, default_value_t = 64)]
    pub publishers: usize,
    /// `pub`s in flight per connection: 1 sends one and waits for its ack before the next;
    /// more keeps that many unacknowledged at all times (pipelining: the next goes out as
    /// each ack comes back).
    #[arg(long, default_value_t = 1)]
    pub window: usize,
    /// Size of each message's `data` JSON in bytes (padded; at least the ~40-byte stamp).
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// How long to publish, e.g. `5s`; only acks that arrive within it count.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Channels (publisher j publishes to `load.publish.{run}.{j % K}`).
    #[arg(long, default_value_t = 1)]
    pub channels: usize,
    /// Longest wait after the end for the acks still outstanding, e.g. `5s`.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub grace: Duration,
    /// Options shared by every scenario.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `tether load connect`: full WebSocket handshakes per second.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectArgs {
    /// Server URL (`ws://host:port/ws`, or `wss://` over TLS).
    pub url: String,
    /// Handshakes to perform; each connection sends close 1000 and is reset right after.
    #[arg(long)]
    pub conns: usize,
    /// Options shared by every scenario.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// How `storm` drops the connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Trigger {
    /// The server drains and restarts: with `--server-pid` this process sends SIGTERM (and runs
    /// `--restart-cmd`); without it, someone else does and the storm starts at the first close.
    Drain,
    /// This process resets (RST) all its sockets at once.
    Cut,
}

/// `tether load storm`: N subscribers dropped at once; time until all are back and resumed.
#[derive(Debug, Clone, clap::Args)]
pub struct StormArgs {
    /// Server URL (`ws://host:port/ws`, or `wss://` over TLS).
    pub url: String,
    /// Subscribers.
    #[arg(long)]
    pub conns: usize,
    /// What drops them.
    #[arg(long, value_enum, default_value_t = Trigger::Cut)]
    pub trigger: Trigger,
    /// Channels (subscriber i on `load.storm.{run}.{i % K}`).
    #[arg(long, default_value_t = 1)]
    pub channels: usize,
    /// With `--trigger drain`: the server process to SIGTERM once all subscribers are primed.
    #[arg(long)]
    pub server_pid: Option<i32>,
    /// With `--trigger drain`: shell command (`sh -c`) run right after the SIGTERM to start the
    /// replacement server; its stdout goes to this process's stderr.
    #[arg(long)]
    pub restart_cmd: Option<String>,
    /// Full-jitter backoff base (docs/protocol.md, the reference client), e.g. `500ms`.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub backoff_base: Duration,
    /// Full-jitter backoff cap (docs/protocol.md, the reference client), e.g. `30s`.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub backoff_cap: Duration,
    /// Give up this long after the trigger (or, for drain without `--server-pid`, after all
    /// are primed and no close came).
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Options shared by every scenario.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Source addresses to bind, in round-robin order (never empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sources(pub Vec<IpAddr>);

impl Sources {
    /// The source address for connection `index` (global index, so `--procs` children agree).
    pub fn pick(&self, index: usize) -> IpAddr {
        self.0[index % self.0.len()]
    }
}

/// Largest number of addresses a `--sources` value may expand to.
const MAX_SOURCES: usize = 1 << 16;

/// Parses `--sources`: comma-separated IPv4 addresses or inclusive ranges `A-B` (A ≤ B).
/// Errors name the bad item.
pub fn parse_sources(s: &str) -> Result<Sources, String> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        match item.split_once('-') {
            Some((a, b)) => {
                let a: Ipv4Addr = a.trim().parse().map_err(|_| format!("bad address in range {item:?}"))?;
                let b: Ipv4Addr = b.trim().parse().map_err(|_| format!("bad address in range {item:?}"))?;
                let (a, b) = (u32::from(a), u32::from(b));
                if a > b {
                    return Err(format!("range {item:?} runs backwards"));
                }
                if (b - a) as usize >= MAX_SOURCES - out.len() {
                    return Err(format!("more than {MAX_SOURCES} source addresses"));
                }
                out.extend((a..=b).map(|n| IpAddr::V4(Ipv4Addr::from(n))));
            }
            None => out.push(item.parse().map_err(|_| format!("bad source address {item:?}"))?),
        }
    }
    if out.is_empty() {
        return Err("no source address given".into());
    }
    Ok(Sources(out))
}

/// A `ws://` or `wss://` endpoint, resolved once: where to connect, whether over TLS, and
/// what to put in the request line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsUrl {
    /// Resolved server address (the first one the name resolves to).
    pub addr: SocketAddr,
    /// `Host` header value (`host:port` as written).
    pub host: String,
    /// Request target, e.g. `/ws` (`/` when the URL has no path).
    pub path: String,
    /// `Some` for `wss://` and `https://`: the TLS client and the name the certificate must carry.
    pub tls: Option<TlsTarget>,
}

impl CommonArgs {
    /// [`parse_ws_url_with`] trusting this run's `--ca`.
    pub fn url(&self, url: &str) -> Result<WsUrl, String> {
        parse_ws_url_with(url, self.ca.as_deref())
    }
}

/// [`parse_ws_url_with`] trusting the system CA bundle for `wss://`.
pub fn parse_ws_url(url: &str) -> Result<WsUrl, String> {
    parse_ws_url_with(url, None)
}

/// Parses and resolves `ws://host[:port][/path]` (port 80 by default) or `wss://…` (443, TLS
/// trusting the PEM CAs of `ca`, else the system bundle). `http://` and `https://` are taken
/// as `ws://` and `wss://` (for `fanout --sse` only the server matters). Errors name the URL:
/// another scheme, no host, a name that does not resolve, an unusable CA file.
pub fn parse_ws_url_with(url: &str, ca: Option<&Path>) -> Result<WsUrl, String> {
    let schemes = [("ws://", false), ("http://", false), ("wss://", true), ("https://", true)];
    let (rest, secure) = schemes
        .iter()
        .find_map(|&(scheme, secure)| url.strip_prefix(scheme).map(|rest| (rest, secure)))
        .ok_or_else(|| format!("{url:?}: only ws://, wss://, http:// and https:// URLs are supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        return Err(format!("{url:?}: no host"));
    }
    let port = authority.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok());
    let with_port = match port {
        Some(_) => authority.to_string(),
        None => format!("{authority}:{}", if secure { 443 } else { 80 }),
    };
    let addr = with_port
        .to_socket_addrs()
        .map_err(|e| format!("{url:?}: cannot resolve: {e}"))?
        .next()
        .ok_or_else(|| format!("{url:?}: resolves to nothing"))?;
    let tls = match secure {
        false => None,
        true => {
            let host = match port {
                Some(_) => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
                None => authority,
            };
            let host = host.trim_start_matches('[').trim_end_matches(']');
            Some(TlsTarget::new(host, ca).map_err(|e| format!("{url:?}: {e}"))?)
        }
    };
    Ok(WsUrl { addr, host: authority.to_string(), path: path.to_string(), tls })
}
