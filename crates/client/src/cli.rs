//! The `switchboard publish` and `switchboard sub` tools (SPEC §5).
//!
//! Both name the node the same way ([`NodeArgs`]): `--url` in any form [`Endpoint`] takes
//! (`http(s)://host:port`, `ws(s)://host:port[/ws]`), a token or a Basic user, and the CA of a
//! TLS node. `publish` prints the reply (`{"offset", "epoch"}`, or `{"written", "source"}` for
//! a write to a device); `sub` prints one JSON line `{"ch", "epoch", "off", "data"}` per
//! publication (and `"hist": true` on a historical one, a source's back-fill, `"tags"` when the
//! publisher gave some) until Ctrl-C or until the server closes the connection. `sub --delta
//! fossil` asks for deltas and prints the publications rebuilt; `sub --filter JSON` passes a
//! tag filter through. Diagnostics go to stderr so stdout stays a clean
//! JSON-lines stream; a failure says what to do about it.

use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context};
use serde_json::Value;
use switchboard_protocol::code::close;
use switchboard_protocol::message::ErrorBody;
use switchboard_protocol::Format;

use crate::client::{Client, ABNORMAL_CLOSE};
use crate::connect::{Compression, ConnectOptions, Credentials};
use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::event::Event;
use crate::http::HttpApi;
use crate::reply::SubscribeOptions;
use crate::resubscribe::{Subscriber, Update, RETRY_FIRST, RETRY_MOST};
use crate::resume::Delivery;
use crate::tls::TlsConfig;

/// The environment variable a `--user`'s password is read from.
pub const PASSWORD_VAR: &str = "SWITCHBOARD_PASSWORD";

/// A mistake in the command line (exit code 2, SPEC §5), as opposed to a failure at run time.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

fn usage(message: impl Into<String>) -> anyhow::Error {
    UsageError(message.into()).into()
}

/// How a tool reaches a node; the same flags for every command.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeArgs {
    /// The node: http(s)://host:port or ws(s)://host:port[/ws], with an optional path prefix;
    /// the WebSocket URL and the HTTP API base both follow from it. A `user:password@` in it
    /// is used as Basic credentials (and never printed).
    #[arg(long, default_value = "http://127.0.0.1:8700", value_name = "URL")]
    pub url: String,
    /// Token or API key, sent as `Authorization: Bearer`.
    #[arg(long, env = "SWITCHBOARD_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub token: Option<String>,
    /// Basic user of the node's users file; the password comes from SWITCHBOARD_PASSWORD,
    /// else a prompt on a terminal, else the first line of stdin.
    #[arg(long, env = "SWITCHBOARD_USER", value_name = "NAME")]
    pub user: Option<String>,
    /// PEM file of the CA that signed the node's certificate (https:// and wss:// URLs);
    /// without it the system's root certificates are trusted.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
}

/// `switchboard publish CHANNEL JSON`
#[derive(Debug, Clone, clap::Args)]
pub struct PublishArgs {
    /// Channel to publish to, e.g. `room:1`.
    pub channel: String,
    /// Publication data: any JSON value, e.g. '{"v": 21.5}', 42 or '"text"' (a string keeps
    /// its JSON quotes).
    pub json: String,
    #[command(flatten)]
    pub node: NodeArgs,
}

/// `switchboard sub CHANNEL...`
#[derive(Debug, Clone, clap::Args)]
pub struct SubArgs {
    /// Channels to subscribe to.
    #[arg(required = true)]
    pub channels: Vec<String>,
    /// Print each channel's last publication first.
    #[arg(long)]
    pub initial: bool,
    /// Ask for live publications as deltas of the previous one (`fossil`: less to send for
    /// publications that change little); they are printed rebuilt, as without it.
    #[arg(long, value_name = "FORMAT", value_parser = ["fossil"])]
    pub delta: Option<String>,
    /// Only publications whose tags match this filter, a JSON tree of comparisons:
    /// '{"key": "kind", "cmp": "eq", "val": "alarm"}', or nodes '{"op": "and", "nodes": [...]}'.
    #[arg(long, value_name = "JSON")]
    pub filter: Option<String>,
    /// Offer permessage-deflate: the node compresses what it sends (larger publications,
    /// replies, recovery); `off` takes every byte as it is.
    #[arg(long, value_enum, default_value = "deflate")]
    pub compression: Compression,
    #[command(flatten)]
    pub node: NodeArgs,
}

/// A node as the flags name it: where it is, how to authenticate, which CAs to trust.
struct Node {
    endpoint: Endpoint,
    credentials: Option<Credentials>,
    tls: Option<TlsConfig>,
}

impl Node {
    /// Resolves the flags; a Basic user's password is read here (environment, prompt, stdin).
    fn resolve(args: &NodeArgs) -> anyhow::Result<Node> {
        let endpoint = Endpoint::parse(&args.url).map_err(|e| usage(format!("--url: {e}")))?;
        let tls = match &args.ca {
            Some(_) if !endpoint.is_tls() => {
                return Err(usage(format!(
                    "--ca is for TLS nodes, and --url {endpoint} is not one (https:// or wss:// is)"
                )))
            }
            Some(path) => Some(TlsConfig::with_ca_file(path).map_err(|e| usage(format!("--ca: {e}")))?),
            None => None,
        };
        let user = match (&args.user, &endpoint.user) {
            (Some(flag), Some(in_url)) if flag != in_url => {
                return Err(usage(format!("--user {flag} and the user {in_url} of --url differ: give one")))
            }
            (Some(u), _) | (None, Some(u)) => Some(u.clone()),
            (None, None) => None,
        };
        let credentials = match (&args.token, user) {
            (Some(_), Some(_)) => {
                return Err(usage(
                    "give a token (--token, SWITCHBOARD_TOKEN) or a Basic user (--user, user@ in --url), not both",
                ))
            }
            (Some(token), None) => Some(Credentials::Bearer(token.clone())),
            (None, Some(user)) => {
                let password = match endpoint.password() {
                    Some(p) => p.to_string(),
                    None => read_password(&user, &endpoint)?,
                };
                Some(Credentials::Basic { user, password })
            }
            (None, None) => None,
        };
        if let Some(c) = &credentials {
            c.header_value().map_err(|e| usage(e.to_string()))?;
        }
        Ok(Node { endpoint, credentials, tls })
    }

    fn api(&self) -> anyhow::Result<HttpApi> {
        let mut api = HttpApi::new(&self.endpoint.api().url())?;
        if let Some(c) = &self.credentials {
            api = api.with_credentials(c.clone());
        }
        if let Some(t) = &self.tls {
            api = api.with_tls(t.clone());
        }
        Ok(api)
    }

    fn connect_options(&self) -> ConnectOptions {
        let mut opts = ConnectOptions::new(Format::Json);
        opts.credentials = self.credentials.clone();
        opts.tls = self.tls.clone();
        opts
    }

    async fn connect(&self, opts: &ConnectOptions) -> Result<Client, Error> {
        Client::connect_with(&self.endpoint.websocket().url(), opts).await
    }

    /// What to do about `e`, where its cause suggests something: the one place every tool's
    /// failures (HTTP replies, handshakes, a channel's refusal, a close) get their hint.
    fn hint(&self, e: &Error) -> Option<String> {
        let not_a_node = || {
            format!(
                "is {} a Switchboard node? --url names the node (http://host:port); a path in it is only a proxy's prefix",
                self.endpoint.api()
            )
        };
        let credentials = || "pass credentials: --token TOKEN (a token or API key) or --user NAME".to_string();
        Some(match e {
            Error::Connect { .. } => {
                "is a node running there? Start one with `switchboard serve`, or name yours with --url".to_string()
            }
            Error::CaCertificate { .. } => {
                "a self-signed certificate (`openssl req -x509`) is a CA certificate: make a \
                test CA and a node certificate signed by it, serve the node certificate and pass the CA with --ca FILE \
                (docs/security.md shows the openssl commands)"
                    .into()
            }
            Error::UntrustedCertificate { .. } => "if a private CA signed it, pass that CA with --ca FILE".into(),
            Error::Tls(m) if m.starts_with("TLS handshake") => {
                "does the node serve TLS on that port? A node without TLS is reached with http:// or ws://".into()
            }
            Error::Decode(m) if m.contains("not HTTP") && !self.endpoint.is_tls() => {
                "if the node serves TLS, use https:// or wss://".into()
            }
            Error::Http { status: 401, .. } | Error::Handshake { status: 401, .. } => credentials(),
            Error::Reply(body) if body.code == 401 => credentials(),
            Error::Handshake { status: 200 | 404, .. } => not_a_node(),
            // A node's own 404 carries a JSON error; a bare one comes from a path it does not
            // serve, usually a path in --url.
            Error::Http { status: 404, body } if !body.trim_start().starts_with('{') => not_a_node(),
            Error::Closed { code: close::INVALID_TOKEN, .. } => {
                "the node refused the credentials: pass a valid --token or --user".into()
            }
            _ => return None,
        })
    }

    /// `e` with what to do about it, where the cause suggests something.
    fn explain(&self, e: Error) -> anyhow::Error {
        match self.hint(&e) {
            Some(hint) => anyhow!("{e}\n  {hint}"),
            None => anyhow!(e),
        }
    }
}

/// A channel's refusal said on stderr, with its hint the first time that hint comes up (a
/// subscribe of many channels refused for one reason says what to do once).
#[derive(Default)]
struct Refusals {
    hinted: HashSet<String>,
}

impl Refusals {
    fn say(&mut self, node: &Node, ch: &str, error: &ErrorBody) {
        eprintln!("{ch}: error {}: {}", error.code, error.message);
        if let Some(hint) = node.hint(&Error::Reply(error.clone())) {
            if self.hinted.insert(hint.clone()) {
                eprintln!("  {hint}");
            }
        }
    }
}

/// The password of Basic user `user`: from [`PASSWORD_VAR`], else prompted for on a
/// terminal, else the first line of stdin (as `switchboard user add` reads it).
fn read_password(user: &str, at: &Endpoint) -> anyhow::Result<String> {
    if let Ok(p) = std::env::var(PASSWORD_VAR) {
        return Ok(p);
    }
    let password = if std::io::stdin().is_terminal() {
        rpassword::prompt_password(format!("password for {user} at {}: ", at.api())).context("reading the password")?
    } else {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).context("reading the password from stdin")?;
        line.trim_end_matches(['\r', '\n']).to_string()
    };
    if password.is_empty() {
        return Err(usage(format!(
            "no password for user {user}: set {PASSWORD_VAR}, pipe it on stdin, or run in a terminal to be asked"
        )));
    }
    Ok(password)
}

/// The JSON argument, or a usage error that shows how to write it.
fn parse_json(text: &str) -> anyhow::Result<Value> {
    serde_json::from_str(text).map_err(|e| {
        let quoted = serde_json::to_string(text).unwrap_or_default();
        usage(format!("the data {text:?} is not JSON ({e}); a string needs JSON quotes inside the shell's: '{quoted}'"))
    })
}

/// Publishes once through the HTTP API and prints the reply.
pub async fn publish(args: PublishArgs) -> anyhow::Result<()> {
    let data = parse_json(&args.json)?;
    let node = Node::resolve(&args.node)?;
    let api = node.api()?;
    let reply = api
        .publish(&args.channel, &data)
        .await
        .map_err(|e| node.explain(e))
        .with_context(|| format!("publish to {}", api.endpoint()))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(&reply)?)?;
    Ok(())
}

/// What `sub` asks of every channel: `--initial`, `--delta`, `--filter` (a usage error when it
/// is not JSON; the node checks its shape).
fn subscribe_options(args: &SubArgs) -> anyhow::Result<SubscribeOptions> {
    let mut options = SubscribeOptions::new(args.channels.iter().cloned()).initial(args.initial);
    options.delta = args.delta.clone();
    if let Some(text) = &args.filter {
        let filter = serde_json::from_str(text).map_err(|e| usage(format!("--filter {text:?} is not JSON: {e}")))?;
        options = options.filter(filter);
    }
    Ok(options)
}

/// Subscribes and prints publications as JSON lines `{"ch", "epoch", "off", "data"}` until
/// Ctrl-C (returns `Ok`) or until the server ends the connection for good (an error naming the
/// close code, unless it was a normal close). The client library's [`Subscriber`] keeps the
/// subscribe-again rule: channels past a reply's budget (413) go again in further commands,
/// channels refused for now (503) or ended by the server (`unsubscribed`) are subscribed again
/// after a growing delay, and every channel resumes from its last printed offset
/// ([`crate::Streams`]): nothing is printed twice, and a gap history no longer covers is said on
/// stderr and followed by the channel's latest value. A connection dropped or closed with a
/// code that asks to reconnect (a node restarting, 4000; a slow consumer, 4008) is made again
/// and every channel resubscribed the same way. A historical publication (a source's back-fill)
/// is printed with `"hist": true`. A publication of `--delta` that cannot be rebuilt is said on
/// stderr and its channel subscribed again, recovering from its last printed offset.
pub async fn sub(args: SubArgs) -> anyhow::Result<()> {
    let options = subscribe_options(&args)?;
    let node = Node::resolve(&args.node)?;
    let mut opts = node.connect_options();
    opts.compression = args.compression;
    let ws_url = node.endpoint.websocket();
    let mut client =
        node.connect(&opts).await.map_err(|e| node.explain(e)).with_context(|| format!("connect to {ws_url}"))?;
    let mut subscriber = Subscriber::new(options);
    subscriber.subscribe_due(&client).await.map_err(|e| node.explain(e)).context("subscribe")?;
    if subscriber.streams().channels().next().is_none() && subscriber.waiting().is_empty() {
        // Say why each channel was refused before failing.
        let mut refusals = Refusals::default();
        while let Some(u) = subscriber.try_next() {
            if let Update::Refused { ch, error } = u {
                refusals.say(&node, &ch, &error);
            }
        }
        bail!("no channel could be subscribed");
    }
    let mut refusals = Refusals::default();
    let stdout = std::io::stdout();
    let print = |d: &Delivery| -> anyhow::Result<bool> {
        let mut out = stdout.lock();
        match writeln!(out, "{}", serde_json::to_string(d)?).and_then(|_| out.flush()) {
            Ok(()) => Ok(true),
            // The reader of our output went away (`| head`): stop quietly.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
            Err(e) => Err(e.into()),
        }
    };
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    // The reason of the server's last `disconnect` push, for a close frame without one.
    let mut said = String::new();
    loop {
        let update = tokio::select! {
            _ = &mut ctrl_c => {
                let _ = client.close().await;
                return Ok(());
            }
            u = subscriber.next(&mut client) => u.map_err(|e| node.explain(e)).context("subscribe")?,
        };
        match update {
            Update::Delivery(d) => {
                if !print(&d)? {
                    return Ok(());
                }
            }
            Update::Gap { gap, followed } => {
                let then = if followed { "; the latest value follows" } else { "" };
                eprintln!("{gap}{then}");
            }
            Update::Waiting { ch, reason } => eprintln!("{ch}: {reason}; subscribing again"),
            Update::Refused { ch, error } => refusals.say(&node, &ch, &error),
            // The close that follows carries the same code; its reason is said then.
            Update::Event(Event::Disconnect { reason, .. }) => said = reason,
            Update::Event(Event::Error(e)) => eprintln!("error {}: {}", e.code, e.message),
            Update::Event(Event::Closed { code: 1000, .. }) => return Ok(()),
            // A node shutting down, restarting or dropping the connection: connect again and
            // resubscribe every channel, recovering from where its stream was.
            Update::Event(Event::Closed { code, mut reason }) if code == ABNORMAL_CLOSE || close::reconnect(code) => {
                if reason.is_empty() {
                    reason = std::mem::take(&mut said);
                }
                let why = if reason.is_empty() { String::new() } else { format!(": {reason}") };
                eprintln!("connection closed (code {code}{why}); reconnecting and recovering");
                let mut pause = RETRY_FIRST;
                client = loop {
                    tokio::select! {
                        _ = &mut ctrl_c => return Ok(()),
                        c = node.connect(&opts) => match c {
                            Ok(c) => break c,
                            Err(e) => eprintln!("connect to {ws_url}: {e}; again in {pause:?}"),
                        },
                    }
                    tokio::select! {
                        _ = &mut ctrl_c => return Ok(()),
                        _ = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(RETRY_MOST);
                };
                subscriber.reconnected();
            }
            Update::Event(Event::Closed { code, mut reason }) => {
                if reason.is_empty() {
                    reason = said;
                }
                return Err(node.explain(Error::Closed { code, reason })).context("the node ended the subscription");
            }
            Update::Event(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use serde_json::json;

    #[derive(Parser)]
    struct Sub {
        #[command(flatten)]
        args: SubArgs,
    }

    fn parse(argv: &[&str]) -> Result<SubArgs, clap::Error> {
        Sub::try_parse_from(std::iter::once("sub").chain(argv.iter().copied())).map(|s| s.args)
    }

    #[test]
    fn cli_sub_passes_delta_and_filter_through() {
        let args =
            parse(&["room:a", "room:b", "--delta", "fossil", "--filter", r#"{"key":"kind","cmp":"eq","val":"alarm"}"#])
                .unwrap();
        let o = serde_json::to_value(subscribe_options(&args).unwrap()).unwrap();
        assert_eq!(
            o,
            json!({"channels": ["room:a", "room:b"], "delta": "fossil", "filter": {"key": "kind", "cmp": "eq", "val": "alarm"}})
        );
        assert!(parse(&["room:a", "--delta", "xdelta"]).is_err(), "fossil is the one format");
        let e = subscribe_options(&parse(&["room:a", "--filter", "kind=alarm"]).unwrap()).unwrap_err();
        assert!(e.downcast_ref::<UsageError>().is_some() && e.to_string().contains("--filter"), "{e}");
        assert_eq!(
            serde_json::to_value(subscribe_options(&parse(&["room:a"]).unwrap()).unwrap()).unwrap(),
            json!({"channels": ["room:a"]})
        );
    }
}
