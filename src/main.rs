//! The `tether` command: `serve`, `sub`, `pub`, `presence`, `load`, `check-limits`, `token`, `feeds`,
//! `api`.

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tether::config::Config;
use tether::server::{self, ServeOptions, Server};
use tether::ws::codec::CloseCode;

/// tether: a WebSocket pub/sub server for long-lived connections.
#[derive(Parser)]
#[command(name = "tether", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the server (embedded defaults; flags override the config file).
    Serve {
        /// TOML config file (every key: docs/configuration.md); every key is optional.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Listen address, IP:PORT, e.g. 0.0.0.0:8080 (port 0 picks a free port); a name such
        /// as localhost:8080 is resolved once at start (IPv4 preferred).
        #[arg(long)]
        listen: Option<String>,
        /// Cores (threads); 0 = one per available CPU.
        #[arg(long)]
        cores: Option<usize>,
        /// Serve GET /echo, a plain RFC 6455 echo endpoint for conformance suites.
        #[arg(long)]
        echo: bool,
    },
    /// Subscribe and print one JSON line per message; reconnects and resumes by itself.
    Sub {
        /// Server URL, e.g. ws://127.0.0.1:8080/ws; several nodes comma-separated
        /// (ws://a:8080/ws,ws://b:8080/ws): each reconnect goes to the next one.
        url: String,
        /// Channel name.
        channel: String,
        /// Resume after this seq (the last one already processed).
        #[arg(long)]
        from: Option<u64>,
        /// Keep committed positions in this file across restarts (at-least-once).
        #[arg(long)]
        offset_file: Option<PathBuf>,
        /// Append messages to this file and resume from the last seq in it (exactly-once).
        #[arg(long)]
        append_to: Option<PathBuf>,
        /// Also print the channel's joins and leaves (presence_diff / presence_reset lines on
        /// stdout, beside the messages); the channel's rule needs join_leave = true.
        #[arg(long)]
        join_leave: bool,
        #[command(flatten)]
        token: TokenFlags,
    },
    /// Publish one JSON value and print the ack; retries until acked.
    Pub {
        /// Server URL, e.g. ws://127.0.0.1:8080/ws; several nodes comma-separated, as for sub.
        url: String,
        /// Channel name.
        channel: String,
        /// The JSON value to publish as `data`.
        data: String,
        /// Message id for dedup (random when absent).
        #[arg(long)]
        id: Option<String>,
        #[command(flatten)]
        token: TokenFlags,
    },
    /// Who is in a presence channel: one JSON line per member, or with --stats the counts.
    Presence {
        /// Server URL, e.g. ws://127.0.0.1:8080/ws; several nodes comma-separated, as for sub.
        url: String,
        /// Channel name (its [[channels]] rule needs presence = true).
        channel: String,
        /// Print {"ch","clients","users"} instead of the members.
        #[arg(long)]
        stats: bool,
        #[command(flatten)]
        token: TokenFlags,
    },
    /// Load generator: idle, fanout, publish, connect and storm scenarios (one JSON line on stdout).
    Load {
        #[command(subcommand)]
        cmd: tether_load::LoadCmd,
    },
    /// Read the OS limits and say how many connections this box can hold.
    CheckLimits(tether::limits::CheckLimitsArgs),
    /// Mint a JWT for a server with [auth] (docs/security.md) and print it.
    Token(tether::auth::mint::TokenArgs),
    /// Upstream feeds through a node's admin API: list, get, put, start, stop, delete
    /// (docs/feeds.md).
    Feeds(tether::client::FeedsArgs),
    /// The server API of a node: batch publish, history, channels, disconnect, unsubscribe,
    /// revoke (docs/api.md); prints the answer as one JSON line.
    Api(tether::client::ApiArgs),
}

/// The token of `sub`, `pub` and `presence` for a server with `[auth]` (docs/security.md).
#[derive(clap::Args)]
struct TokenFlags {
    /// JWT sent as ?token= on the URL (see `tether token`).
    #[arg(long, conflicts_with = "token_file")]
    token: Option<String>,
    /// File holding the JWT, read again at each connection and when the token expires (a
    /// process that rewrites it keeps the connection alive with `refresh`).
    #[arg(long)]
    token_file: Option<PathBuf>,
}

impl TokenFlags {
    fn source(self) -> Option<tether::client::TokenSource> {
        match (self.token, self.token_file) {
            (Some(t), _) => Some(tether::client::TokenSource::fixed(t)),
            (None, Some(f)) => Some(tether::client::TokenSource::file(f)),
            (None, None) => None,
        }
    }
}

fn main() -> ExitCode {
    let spec = std::env::var("TETHER_LOG").ok();
    let (filter, problem) = tether::logging::filter(spec.as_deref());
    if let Some(problem) = problem {
        eprintln!("tether: {problem}; logging at info");
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Serve { config, listen, cores, echo } => serve(config, listen, cores, echo),
        Cmd::Sub { url, channel, from, offset_file, append_to, join_leave, token } => {
            let token = token.source();
            let args = tether::client::SubArgs { url, channel, from, offset_file, append_to, token, join_leave };
            client_main(tether::client::run_sub(args))
        }
        Cmd::Pub { url, channel, data, id, token } => {
            let args = tether::client::PubArgs { url, channel, data, id, token: token.source() };
            client_main(tether::client::run_pub(args))
        }
        Cmd::Presence { url, channel, stats, token } => {
            let args = tether::client::PresenceArgs { url, channel, stats, token: token.source() };
            client_main(tether::client::run_presence(args))
        }
        Cmd::Load { cmd } => ExitCode::from(tether_load::run(cmd) as u8),
        Cmd::CheckLimits(args) => ExitCode::from(args.run() as u8),
        Cmd::Token(args) => ExitCode::from(args.run() as u8),
        Cmd::Feeds(args) => ExitCode::from(args.run() as u8),
        Cmd::Api(args) => ExitCode::from(args.run() as u8),
    }
}

fn client_main<E: std::fmt::Display>(fut: impl std::future::Future<Output = Result<(), E>>) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tether: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(fut);
    // Tasks still running (the client's, a DNS lookup) must not hold the exit back.
    rt.shutdown_timeout(std::time::Duration::from_millis(20));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tether::client::notice(&format!("tether: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// `--listen`: `IP:PORT`, or `NAME:PORT` resolved once here (`localhost:8098`), its first
/// IPv4 address preferred.
///
/// # Errors
/// A message saying to use an IP address when the value is neither.
fn listen_addr(arg: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = arg.parse() {
        return Ok(a);
    }
    let use_ip = "use IP:PORT, e.g. 127.0.0.1:8080 or 0.0.0.0:8080 ([::]:8080 for IPv6)";
    let resolved: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(arg)
        .map_err(|e| format!("--listen {arg}: not IP:PORT and does not resolve ({e}); {use_ip}"))?
        .collect();
    let first = resolved.iter().find(|a| a.is_ipv4()).or(resolved.first()).copied();
    let addr = first.ok_or_else(|| format!("--listen {arg}: resolves to no address; {use_ip}"))?;
    tracing::info!(listen = arg, addr = %addr, "--listen resolved");
    Ok(addr)
}

fn serve(config: Option<PathBuf>, listen: Option<String>, cores: Option<usize>, echo: bool) -> ExitCode {
    tether::server::reclaim::configure_allocator();
    let source = config.as_ref().map_or_else(|| "built-in defaults".to_owned(), |p| p.display().to_string());
    let mut cfg = match config {
        Some(path) => match Config::load(&path) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        },
        None => Config::default(),
    };
    if let Some(l) = listen {
        match listen_addr(&l) {
            Ok(a) => cfg.listen = a,
            Err(e) => {
                eprintln!("tether: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(c) = cores {
        cfg.cores = c;
    }
    if let Err(e) = cfg.validate() {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    // The key file is read once, here, so an unusable key is a config error (exit 2).
    let auth = match tether::auth::Verifier::from_config(cfg.auth.as_ref()) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    // The TLS pair too: an unreadable file or a key that does not match is a config error.
    let tls = match cfg.tls.as_ref().map(tether::server::tls::keys::Keys::load).transpose() {
        Ok(k) => k.map(std::sync::Arc::new),
        Err(e) => {
            eprintln!("tls: {e}");
            return ExitCode::from(2);
        }
    };
    tracing::info!(source = %source, "config in effect: {}", cfg.summary());
    let memory =
        std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| tether::limits::meminfo_bytes(&m, "MemTotal"));
    for w in cfg.warnings(memory) {
        tracing::warn!("{w}");
    }
    let nofile = server::raise_nofile();
    match &nofile {
        Ok(n) if n.before < n.soft => {
            tracing::info!(
                soft_before = n.before,
                soft = n.soft,
                hard = n.hard,
                "RLIMIT_NOFILE soft limit raised to the hard limit"
            )
        }
        Ok(n) => tracing::info!(soft = n.soft, hard = n.hard, "RLIMIT_NOFILE soft limit already at the hard limit"),
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the RLIMIT_NOFILE soft limit; connections beyond it fail with EMFILE")
        }
    }
    if let Some(n) = nofile.as_ref().ok().filter(|n| n.hard < cfg.max_connections as u64) {
        tracing::warn!(
            hard = n.hard,
            max_connections = cfg.max_connections,
            "the open-file hard limit is below max_connections; see `tether check-limits` and sysctl/"
        );
    }
    if let Err(e) = server::block_signals() {
        eprintln!("tether: cannot block SIGTERM/SIGINT/SIGHUP for the drain (pthread_sigmask: {e})");
        return ExitCode::FAILURE;
    }
    let srv = match Server::start(cfg, ServeOptions { echo, auth, tls }) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tether: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Tests and scripts read the bound address from this line.
    println!("tether listening on {}", srv.local_addr());
    if let Some(at) = srv.tls_addr().filter(|&a| a != srv.local_addr()) {
        println!("tether listening for TLS on {at}");
    }
    let code = loop {
        match server::wait_signal() {
            // `systemctl reload`: the TLS pair is read again (logged either way).
            Ok(libc::SIGHUP) => {
                if let Err(e) = srv.reload_tls() {
                    tracing::warn!("SIGHUP: {e}");
                }
            }
            Ok(libc::SIGINT) => break CloseCode::Away,
            Ok(_) => break CloseCode::from(srv.shared().config.drain.close_code),
            Err(e) => {
                tracing::error!(error = %e, "sigwait failed; draining with 1001");
                break CloseCode::Away;
            }
        }
    };
    srv.shutdown(code);
    // A second SIGTERM or SIGINT while draining ends the process at once.
    std::thread::spawn(|| loop {
        match server::wait_signal() {
            Ok(libc::SIGHUP) => tracing::info!("SIGHUP while draining: ignored"),
            Ok(_) => {
                tracing::warn!("second signal: exiting without finishing the drain");
                std::process::exit(1);
            }
            Err(_) => return,
        }
    });
    srv.wait();
    tracing::info!("drained, exiting");
    ExitCode::SUCCESS
}
