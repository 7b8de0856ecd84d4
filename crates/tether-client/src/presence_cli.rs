//! `tether presence URL CH [--stats]` (docs/clients.md): who is in a presence channel, or how
//! many, as JSON lines on stdout.

use std::future::Future;

use tokio::io::AsyncWriteExt;

use super::cli::{close_quickly, quiet_on_closed_pipe, shutdown_signal, url_config, Lines};
use super::session::Client;
use super::wire::check_channel;
use super::{ClientError, Event, TokenSource};

/// Arguments of `tether presence URL CH [--stats] [--token T | --token-file F]`.
#[derive(Debug, Clone)]
pub struct PresenceArgs {
    /// `ws://HOST:PORT/ws`, or several separated by commas, as [`super::SubArgs::url`].
    pub url: String,
    /// The presence channel to ask about.
    pub channel: String,
    /// Ask `presence_stats` (how many) instead of `presence` (who).
    pub stats: bool,
    /// The JWT for a server with `[auth]`, as [`super::SubArgs::token`]; it needs the
    /// channel's `sub` right.
    pub token: Option<TokenSource>,
}

/// `tether presence`: asks the server who is in the channel (every page) and prints one member
/// per line on stdout, `{"client":…,"user":…,"info":…}` (`user` and `info` left out where the
/// server has none), nothing for an empty channel; with `stats`, one line
/// `{"ch":…,"clients":N,"users":M}`. Waits across reconnects until answered (the same
/// `disconnected` / `connected` lines on stderr as `tether pub`); Ctrl-C or SIGTERM ends the
/// wait.
///
/// # Errors
/// [`ClientError::InvalidChannel`] and [`ClientError::InvalidUrl`] before connecting;
/// [`ClientError::Refused`] (also written on stderr as `{"op":"error",…}`) when the server
/// refuses: `presence_off`, `forbidden`, `limit`; [`ClientError::Closed`] on a stop close
/// code; [`ClientError::Shutdown`] on a signal.
pub async fn run_presence(args: PresenceArgs) -> Result<(), ClientError> {
    run_presence_until(args, shutdown_signal()).await
}

/// `run_presence` with the stop condition supplied by the caller.
pub(super) async fn run_presence_until(
    args: PresenceArgs,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ClientError> {
    check_channel(&args.channel)?;
    let cfg = url_config(&args.url, args.token.clone())?;
    let mut client = Client::connect(cfg)?;
    let asker = client.publisher();
    let ch = args.channel.as_str();
    let mut lines = Lines::default();
    let answer = async {
        let query = async {
            if args.stats {
                let s = asker.presence_stats(ch).await?;
                serde_json::to_string(&s).map(|l| vec![l]).map_err(|e| ClientError::Io(e.to_string()))
            } else {
                Ok(asker.presence(ch).await?.iter().map(ToString::to_string).collect::<Vec<_>>())
            }
        };
        tokio::pin!(query, shutdown);
        loop {
            tokio::select! {
                answer = &mut query => return answer,
                () = &mut shutdown => return Err(ClientError::Shutdown),
                ev = client.next_event() => lines.print(&ev?),
            }
        }
    }
    .await;
    if let Err(ClientError::Refused { code, reason, .. }) = &answer {
        let (code, reason, ch) = (code.clone(), reason.clone(), Some(args.channel.clone()));
        lines.print(&Event::Error { code, reason, id: None, ch });
    }
    close_quickly(client).await;
    let mut text = String::new();
    for line in answer? {
        text.push_str(&line);
        text.push('\n');
    }
    let mut out = tokio::io::stdout();
    let written = async {
        out.write_all(text.as_bytes()).await?;
        out.flush().await
    };
    quiet_on_closed_pipe(written.await.map_err(ClientError::from))
}
