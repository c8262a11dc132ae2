//! The `switchboard publish` and `switchboard sub` tools (SPEC §5).
//!
//! `publish` prints the reply `{"offset", "epoch"}`; `sub` prints one JSON line
//! `{"ch", "off", "data"}` per publication until Ctrl-C or until the server closes the
//! connection. Diagnostics go to stderr so stdout stays a clean JSON-lines stream.

use std::collections::HashMap;
use std::io::Write;

use anyhow::{bail, Context};
use serde_json::Value;
use switchboard_protocol::code::close;
use switchboard_protocol::{Format, StreamPosition};

use crate::client::{Client, ABNORMAL_CLOSE};
use crate::connect::ConnectOptions;
use crate::event::{Event, Publication};
use crate::http::HttpApi;
use crate::reply::{ChannelResult, SubscribeOptions};

/// `switchboard publish CHANNEL JSON`
#[derive(Debug, Clone, clap::Args)]
pub struct PublishArgs {
    /// Channel to publish to, e.g. `room:1`.
    pub channel: String,
    /// Publication data: any JSON value, e.g. '{"v": 21.5}'.
    pub json: String,
    /// Base URL of the node's HTTP API.
    #[arg(long, default_value = "http://127.0.0.1:8700")]
    pub url: String,
    /// API key or token, sent as `Authorization: Bearer`.
    #[arg(long)]
    pub token: Option<String>,
}

/// `switchboard sub CHANNEL...`
#[derive(Debug, Clone, clap::Args)]
pub struct SubArgs {
    /// Channels to subscribe to.
    #[arg(required = true)]
    pub channels: Vec<String>,
    /// WebSocket URL of the node.
    #[arg(long, default_value = "ws://127.0.0.1:8700/ws")]
    pub url: String,
    /// Print each channel's last publication first.
    #[arg(long)]
    pub initial: bool,
    /// Token, sent as `Authorization: Bearer` with the handshake.
    #[arg(long)]
    pub token: Option<String>,
}

/// Publishes once through the HTTP API and prints the reply.
pub async fn publish(args: PublishArgs) -> anyhow::Result<()> {
    let data: Value = serde_json::from_str(&args.json).with_context(|| format!("JSON argument {:?}", args.json))?;
    let mut api = HttpApi::new(&args.url).with_context(|| format!("--url {}", args.url))?;
    if let Some(t) = args.token {
        api = api.with_token(t);
    }
    let reply = api.publish(&args.channel, &data).await.with_context(|| format!("publish to {}", args.url))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(&reply)?)?;
    Ok(())
}

/// The first delay before subscribing a channel refused for now (503) again, and the longest.
const RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(500);
const RETRY_MOST: std::time::Duration = std::time::Duration::from_secs(5);

/// Subscribes and prints publications as JSON lines until Ctrl-C (returns `Ok`) or until the
/// server ends the connection for good (an error naming the close code, unless it was a
/// normal close). A connection dropped or closed with a code that asks to reconnect (a node
/// restarting, 4000; a slow consumer, 4008) is made again, and every channel resumes from its
/// last printed offset: nothing is printed twice, and a gap history no longer covers is said.
pub async fn sub(args: SubArgs) -> anyhow::Result<()> {
    let mut opts = ConnectOptions::new(Format::Json);
    opts.token = args.token.clone();
    let mut client =
        Client::connect_with(&args.url, &opts).await.with_context(|| format!("connect to {}", args.url))?;
    let mut reply = client
        .subscribe(SubscribeOptions::new(args.channels.iter().cloned()).initial(args.initial))
        .await
        .context("subscribe")?;
    // Channels past the server's reply budget (413) are subscribed again in another command,
    // while replies take some.
    let mut asked = reply.channels.len();
    loop {
        let again: Vec<String> = reply.errors().filter(|(_, e)| e.code == 413).map(|(ch, _)| ch.to_string()).collect();
        if again.is_empty() || again.len() >= asked {
            break;
        }
        asked = again.len();
        let more = client
            .subscribe(SubscribeOptions::new(again.iter().cloned()).initial(args.initial))
            .await
            .context("subscribe")?;
        reply.channels.extend(more.channels);
    }
    let mut ok = 0;
    let mut last = Vec::new();
    // Where each channel's stream is, to subscribe it again with `recover` after the server
    // ended its subscription (`unsubscribed`: its broker shard may have lost publications).
    let mut positions: HashMap<String, StreamPosition> = HashMap::new();
    // Channels to subscribe again: refused for now (503: their shard is failing over) or
    // ended by the server; asked again at `retry_at`, with a growing delay, while the others
    // stream.
    let mut waiting = Vec::new();
    for ch in &args.channels {
        match reply.channels.get(ch) {
            Some(ChannelResult::Subscribed(s)) => {
                ok += 1;
                last.extend(s.last.clone());
                positions.insert(ch.clone(), StreamPosition { epoch: s.epoch.clone(), offset: s.offset });
            }
            Some(ChannelResult::Error { error }) if error.code == 503 => {
                eprintln!("{ch}: {}; subscribing again", error.message);
                waiting.push(ch.clone());
            }
            Some(ChannelResult::Error { error }) => {
                eprintln!("{ch}: error {}: {}", error.code, error.message)
            }
            None => eprintln!("{ch}: missing from the subscribe reply"),
        }
    }
    if ok == 0 && waiting.is_empty() {
        bail!("no channel could be subscribed");
    }
    let mut retry_in = RETRY_FIRST;
    let mut retry_at = tokio::time::Instant::now() + retry_in;
    let stdout = std::io::stdout();
    let print = |p: &Publication| -> anyhow::Result<bool> {
        let mut out = stdout.lock();
        match writeln!(out, "{}", serde_json::to_string(p)?).and_then(|_| out.flush()) {
            Ok(()) => Ok(true),
            // The reader of our output went away (`| head`): stop quietly.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
            Err(e) => Err(e.into()),
        }
    };
    for p in &last {
        if !print(p)? {
            return Ok(());
        }
    }
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            _ = &mut ctrl_c => {
                let _ = client.close().await;
                return Ok(());
            }
            _ = tokio::time::sleep_until(retry_at), if !waiting.is_empty() => {
                let mut again = SubscribeOptions::new(waiting.iter().cloned()).initial(args.initial);
                for ch in &waiting {
                    if let Some(pos) = positions.get(ch) {
                        again = again.recover(ch.clone(), pos.epoch.clone(), pos.offset);
                    }
                }
                let reply = client.subscribe(again).await.context("subscribe")?;
                waiting.clear();
                for (ch, result) in reply.channels {
                    match result {
                        ChannelResult::Subscribed(s) => {
                            let resumed = positions.contains_key(&ch);
                            if resumed && !s.complete {
                                eprintln!("{ch}: publications after offset {} are no longer in history", positions[&ch].offset);
                            }
                            let shown = if resumed { s.recovered.iter().collect::<Vec<_>>() } else { s.last.iter().collect() };
                            for p in shown {
                                if !print(p)? {
                                    return Ok(());
                                }
                            }
                            positions.insert(ch, StreamPosition { epoch: s.epoch, offset: s.offset });
                        }
                        // 503: its shard is failing over; 413: past this reply's budget.
                        ChannelResult::Error { error } if error.code == 503 || error.code == 413 => waiting.push(ch),
                        ChannelResult::Error { error } => eprintln!("{ch}: error {}: {}", error.code, error.message),
                    }
                }
                retry_in = (retry_in * 2).min(RETRY_MOST);
                retry_at = tokio::time::Instant::now() + retry_in;
            }
            ev = client.next_event() => match ev {
                Some(Event::Publication(p)) => {
                    if let Some(pos) = positions.get_mut(&p.ch) {
                        pos.offset = p.off;
                    }
                    if !print(&p)? {
                        return Ok(());
                    }
                }
                Some(Event::Unsubscribed { ch, reason, .. }) => {
                    eprintln!("{ch}: {reason}; subscribing again");
                    if waiting.is_empty() {
                        retry_in = RETRY_FIRST;
                        retry_at = tokio::time::Instant::now();
                    }
                    waiting.push(ch);
                }
                Some(Event::Disconnect { code, reason, .. }) => eprintln!("disconnect {code}: {reason}"),
                Some(Event::Error(e)) => eprintln!("error {}: {}", e.code, e.message),
                Some(Event::Join(_) | Event::Leave(_) | Event::Subscribed(_)) => {}
                Some(Event::Closed { code: 1000 }) | None => return Ok(()),
                // A node shutting down, restarting or dropping the connection: connect again
                // and resubscribe every channel, recovering from where its stream was.
                Some(Event::Closed { code }) if code == ABNORMAL_CLOSE || close::reconnect(code) => {
                    eprintln!("connection closed (code {code}); reconnecting and recovering");
                    let mut pause = RETRY_FIRST;
                    client = loop {
                        tokio::select! {
                            _ = &mut ctrl_c => return Ok(()),
                            c = Client::connect_with(&args.url, &opts) => match c {
                                Ok(c) => break c,
                                Err(e) => eprintln!("connect to {}: {e}; again in {pause:?}", args.url),
                            },
                        }
                        tokio::select! {
                            _ = &mut ctrl_c => return Ok(()),
                            _ = tokio::time::sleep(pause) => {}
                        }
                        pause = (pause * 2).min(RETRY_MOST);
                    };
                    for ch in positions.keys() {
                        if !waiting.contains(ch) {
                            waiting.push(ch.clone());
                        }
                    }
                    retry_in = RETRY_FIRST;
                    retry_at = tokio::time::Instant::now();
                }
                Some(Event::Closed { code }) => bail!("connection closed by the server (code {code})"),
            }
        }
    }
}
