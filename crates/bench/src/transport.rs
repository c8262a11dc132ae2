//! How a load-generating client reaches the server: WebSocket, SSE or long-polling
//! (`--transport`), behind one [`Conn`] that the fan-out scenarios use like a WebSocket —
//! `send` a command frame, `next` the following frame of server messages.
//!
//! The HTTP transports speak the protocol through a poll session (`POST /poll`):
//! - `poll`: a task holds `GET /poll/{session}?ack=<seq>` on its own connection, one request
//!   after the other, and hands each batch on as one frame (its messages `\n`-separated);
//! - `sse`: a task reads the session's event stream (`GET /sse?session=<id>`), and hands on
//!   what each read brought as one frame;
//!
//! and commands (subscribe, and the rooms' publishes) go by `POST /poll/{session}` on a second
//! connection, as a browser would; a `broadcast` subscriber, which sends nothing more, closes
//! that connection once subscribed ([`Conn::release_commands`]). Replies then arrive in order
//! with the publications, as on a WebSocket, so the scenarios' accounting does not change.
//! Both are JSON only.
//!
//! `sse-channels` is a plain stream, `GET /sse?channels=…`, as an `EventSource` opens it: the
//! client's first command must be a subscribe, which opens the stream for its channels; the
//! stream's `subscribed` event is handed on as that command's reply. It takes no other command.
//!
//! A minimal HTTP/1.1 client is written here rather than borrowed, because the load generator
//! must bind its connections to spread source addresses (like the WebSocket clients) and read
//! a chunked event stream incrementally; [`switchboard_client::HttpApi`] does neither.

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, Stream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use switchboard_client::connect::{connect_tcp, handshake, ConnectOptions, Endpoint};
use switchboard_client::{WireStats, WsStream};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

/// `--transport`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// WebSocket (`/ws`).
    #[default]
    Ws,
    /// Server-Sent Events of a poll session (`/sse?session=`), commands by POST.
    Sse,
    /// Long-polling (`/poll`).
    Poll,
    /// Server-Sent Events of a plain stream (`/sse?channels=`): subscriptions only.
    #[serde(rename = "sse-channels")]
    SseChannels,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Ws => "ws",
            Transport::Sse => "sse",
            Transport::Poll => "poll",
            Transport::SseChannels => "sse-channels",
        }
    }

    /// The HTTP transports carry JSON only.
    pub fn check_format(self, format: switchboard_protocol::Format) -> anyhow::Result<()> {
        if self != Transport::Ws && format != switchboard_protocol::Format::Json {
            anyhow::bail!("--transport {} carries JSON only; use --format json", self.name());
        }
        Ok(())
    }
}

/// One client connection over any transport: a [`Stream`] of frames, and `send`.
// The WebSocket stays inline: it is what every existing WebSocket run used, and one Conn
// lives per connection task, so the size of the smaller variant buys nothing.
#[allow(clippy::large_enum_variant)]
pub enum Conn {
    Ws(WsStream),
    Http(Box<HttpConn>),
}

/// A poll session: commands out, frames in.
pub struct HttpConn {
    link: CommandLink,
    frames: Frames,
}

/// The sending half.
#[allow(clippy::large_enum_variant)]
pub enum ConnSink {
    Ws(SplitSink<WsStream, Message>),
    Http(CommandLink),
}

/// The receiving half.
pub enum ConnStream {
    Ws(SplitStream<WsStream>),
    Http(Frames),
}

impl Conn {
    /// Connects to `target` (the `ws://host:port/ws` URL the scenarios are given) over
    /// `transport`.
    pub async fn connect(transport: Transport, target: &str, opts: &ConnectOptions) -> Result<Conn, String> {
        if transport == Transport::Ws {
            return handshake(target, opts).await.map(Conn::Ws).map_err(|e| e.to_string());
        }
        if transport == Transport::SseChannels {
            let server = Server::of(target, opts)?;
            let (tx, rx) = mpsc::unbounded_channel();
            let link =
                CommandLink { server, session: String::new(), conn: None, stream: Some(StreamLink::Waiting(tx)) };
            // The stream opens with the first command; its task is the link's.
            let reader = tokio::spawn(async {});
            return Ok(Conn::Http(Box::new(HttpConn { link, frames: Frames { rx, reader } })));
        }
        let attempt = async {
            let server = Server::of(target, opts)?;
            let mut link = CommandLink { server: server.clone(), session: String::new(), conn: None, stream: None };
            let (status, body) = link.request("POST", "/poll", b"").await?;
            if status != 200 {
                return Err(format!("POST /poll: HTTP {status} {}", String::from_utf8_lossy(&body)));
            }
            #[derive(Deserialize)]
            struct Opened {
                session: String,
            }
            let opened: Opened =
                serde_json::from_slice(&body).map_err(|e| format!("POST /poll: unexpected reply ({e})"))?;
            link.session = opened.session;
            OPEN.with(|o| o.borrow_mut().insert(link.session.clone(), server.clone()));
            let (tx, rx) = mpsc::unbounded_channel();
            let reader = match transport {
                Transport::Sse => {
                    let mut stream = server.open().await?;
                    let path = format!("{}/sse?session={}", server.base_path, link.session);
                    write_head(stream.get_mut(), &server, "GET", &path, None).await?;
                    let (status, headers) = read_head(&mut stream).await?;
                    if status != 200 {
                        return Err(format!("GET /sse: HTTP {status}"));
                    }
                    tokio::spawn(sse_task(stream, headers.chunked, tx, None))
                }
                _ => tokio::spawn(poll_task(server, link.session.clone(), tx)),
            };
            Ok(Conn::Http(Box::new(HttpConn { link, frames: Frames { rx, reader } })))
        };
        tokio::time::timeout(opts.timeout, attempt).await.map_err(|_| "connect: timed out".to_string())?
    }

    pub async fn send(&mut self, msg: Message) -> Result<(), String> {
        match self {
            Conn::Ws(ws) => ws.send(msg).await.map_err(|e| e.to_string()),
            Conn::Http(h) => h.link.send(msg).await,
        }
    }

    /// What crossed the socket, where the transport counts it (a WebSocket's [`Wire`]): kept
    /// by the caller across [`Conn::split`].
    ///
    /// [`Wire`]: switchboard_client::Wire
    pub fn wire_stats(&self) -> Option<Arc<WireStats>> {
        match self {
            Conn::Ws(ws) => Some(ws.get_ref().stats().clone()),
            Conn::Http(_) => None,
        }
    }

    /// Closes the kept-alive connection an HTTP transport's commands go on (the next command
    /// opens another); nothing for a WebSocket. A client with nothing more to send lets it go,
    /// so that its teardown is part of the setup and not of what is measured after it (the
    /// node closes an idle one after `limits.handshake_timeout_s`).
    pub fn release_commands(&mut self) {
        if let Conn::Http(h) = self {
            h.link.conn = None;
        }
    }

    pub fn split(self) -> (ConnSink, ConnStream) {
        match self {
            Conn::Ws(ws) => {
                let (sink, stream) = ws.split();
                (ConnSink::Ws(sink), ConnStream::Ws(stream))
            }
            Conn::Http(h) => {
                let HttpConn { link, frames } = *h;
                (ConnSink::Http(link), ConnStream::Http(frames))
            }
        }
    }
}

impl ConnSink {
    pub async fn send(&mut self, msg: Message) -> Result<(), String> {
        match self {
            ConnSink::Ws(s) => s.send(msg).await.map_err(|e| e.to_string()),
            ConnSink::Http(link) => link.send(msg).await,
        }
    }
}

impl Stream for Conn {
    type Item = Result<Message, String>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.get_mut() {
            Conn::Ws(ws) => Pin::new(ws).poll_next(cx).map(|o| o.map(|r| r.map_err(|e| e.to_string()))),
            Conn::Http(h) => h.frames.rx.poll_recv(cx),
        }
    }
}

impl Stream for ConnStream {
    type Item = Result<Message, String>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.get_mut() {
            ConnStream::Ws(s) => Pin::new(s).poll_next(cx).map(|o| o.map(|r| r.map_err(|e| e.to_string()))),
            ConnStream::Http(frames) => frames.rx.poll_recv(cx),
        }
    }
}

/// Frames read by a background task (cancel-safe to wait on).
pub struct Frames {
    rx: mpsc::UnboundedReceiver<Result<Message, String>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Frames {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Where and as whom the HTTP requests go.
#[derive(Clone)]
struct Server {
    host: String,
    port: u16,
    authority: String,
    /// Path prefix before `/poll` and `/sse` (the target's path without its `/ws`).
    base_path: String,
    bind: Option<IpAddr>,
    /// The `Authorization` header value of the handshake's credentials.
    authorization: Option<String>,
}

impl Server {
    fn of(target: &str, opts: &ConnectOptions) -> Result<Server, String> {
        let ep = Endpoint::parse(target).map_err(|e| e.to_string())?;
        let path = ep.path.split('?').next().unwrap_or("").trim_end_matches('/');
        let base_path = path.strip_suffix("/ws").unwrap_or(path).to_string();
        Ok(Server {
            authority: ep.authority(),
            host: ep.host,
            port: ep.port,
            base_path,
            bind: opts.bind,
            authorization: match &opts.credentials {
                Some(c) => {
                    Some(c.header_value().map_err(|e| e.to_string())?.to_str().map_err(|e| e.to_string())?.to_string())
                }
                None => None,
            },
        })
    }

    async fn open(&self) -> Result<BufReader<TcpStream>, String> {
        let tcp = connect_tcp(&self.host, self.port, self.bind).await.map_err(|e| format!("connect: {e}"))?;
        Ok(BufReader::with_capacity(16 * 1024, tcp))
    }
}

/// `POST /poll/{session}` on a kept-alive connection of its own; for `sse-channels`, the
/// stream its subscribe opens.
pub struct CommandLink {
    server: Server,
    session: String,
    conn: Option<BufReader<TcpStream>>,
    stream: Option<StreamLink>,
}

/// A plain stream's side of the link.
enum StreamLink {
    /// Not open yet: where its frames will go.
    Waiting(mpsc::UnboundedSender<Result<Message, String>>),
    /// Open: its reading task.
    Open(tokio::task::JoinHandle<()>),
}

impl Drop for CommandLink {
    fn drop(&mut self) {
        if let Some(StreamLink::Open(task)) = &self.stream {
            task.abort();
        }
    }
}

impl CommandLink {
    async fn send(&mut self, msg: Message) -> Result<(), String> {
        let body: Vec<u8> = match msg {
            Message::Text(t) => t.as_bytes().to_vec(),
            Message::Binary(_) => return Err("the HTTP transports carry JSON only".into()),
            _ => return Ok(()),
        };
        match self.stream.take() {
            None => {}
            Some(StreamLink::Waiting(tx)) => {
                let task = self.open_stream(&body, tx).await?;
                self.stream = Some(StreamLink::Open(task));
                return Ok(());
            }
            Some(open) => {
                self.stream = Some(open);
                return Err("--transport sse-channels takes no command after its subscribe".into());
            }
        }
        let path = format!("/poll/{}", self.session);
        let (status, reply) = self.request("POST", &path, &body).await?;
        if status != 202 {
            return Err(format!("POST {path}: HTTP {status} {}", String::from_utf8_lossy(&reply)));
        }
        Ok(())
    }

    /// Opens `GET /sse?channels=` for the subscribe command `cmd`; its `subscribed` event
    /// becomes the command's reply.
    async fn open_stream(
        &self,
        cmd: &[u8],
        tx: mpsc::UnboundedSender<Result<Message, String>>,
    ) -> Result<tokio::task::JoinHandle<()>, String> {
        #[derive(Deserialize)]
        struct Subscribe {
            channels: Vec<String>,
            #[serde(default)]
            initial: bool,
        }
        #[derive(Deserialize)]
        struct Command {
            id: u64,
            subscribe: Subscribe,
        }
        let c: Command = serde_json::from_slice(cmd)
            .map_err(|_| "--transport sse-channels: the first command must be a subscribe".to_string())?;
        let channels: Vec<String> = c.subscribe.channels.iter().map(|ch| query_escape(ch)).collect();
        let mut path = format!("{}/sse?channels={}", self.server.base_path, channels.join(","));
        if c.subscribe.initial {
            path.push_str("&initial=true");
        }
        let mut stream = self.server.open().await?;
        write_head(stream.get_mut(), &self.server, "GET", &path, None).await?;
        let (status, headers) = read_head(&mut stream).await?;
        if status != 200 {
            return Err(format!("GET /sse: HTTP {status}"));
        }
        Ok(tokio::spawn(sse_task(stream, headers.chunked, tx, Some(c.id))))
    }

    async fn request(&mut self, method: &str, path: &str, body: &[u8]) -> Result<(u16, Vec<u8>), String> {
        let full = format!("{}{path}", self.server.base_path);
        for attempt in 0..2 {
            let mut conn = match self.conn.take() {
                Some(c) => c,
                None => self.server.open().await?,
            };
            match exchange(&mut conn, &self.server, method, &full, Some(body)).await {
                Ok(r) => {
                    self.conn = Some(conn);
                    return Ok(r);
                }
                // A kept-alive connection the server closed: once more on a new one.
                Err(e) if attempt == 0 && e.starts_with("closed") => continue,
                Err(e) => return Err(e),
            }
        }
        Err("connection closed".into())
    }
}

struct Head {
    chunked: bool,
    length: Option<usize>,
}

async fn write_head(
    tcp: &mut TcpStream,
    server: &Server,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> Result<(), String> {
    let mut h = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", server.authority);
    if let Some(a) = &server.authorization {
        h.push_str(&format!("Authorization: {a}\r\n"));
    }
    if let Some(b) = body {
        h.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()));
    }
    h.push_str("\r\n");
    let mut out = h.into_bytes();
    if let Some(b) = body {
        out.extend_from_slice(b);
    }
    tcp.write_all(&out).await.map_err(|e| format!("closed: write: {e}"))
}

async fn read_head(conn: &mut BufReader<TcpStream>) -> Result<(u16, Head), String> {
    let mut line = String::new();
    if conn.read_line(&mut line).await.map_err(|e| format!("closed: read: {e}"))? == 0 {
        return Err("closed: before the response".into());
    }
    let status: u16 =
        line.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| format!("bad status line {line:?}"))?;
    let mut head = Head { chunked: false, length: None };
    loop {
        line.clear();
        if conn.read_line(&mut line).await.map_err(|e| format!("read: {e}"))? == 0 {
            return Err("connection closed in the response head".into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            return Ok((status, head));
        }
        let Some((name, value)) = l.split_once(':') else { continue };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            head.length = value.parse().ok();
        } else if name.eq_ignore_ascii_case("transfer-encoding") && value.eq_ignore_ascii_case("chunked") {
            head.chunked = true;
        }
    }
}

/// One chunk of a chunked body; empty at its end.
async fn read_chunk(conn: &mut BufReader<TcpStream>) -> Result<Vec<u8>, String> {
    let mut line = String::new();
    if conn.read_line(&mut line).await.map_err(|e| format!("read: {e}"))? == 0 {
        return Err("connection closed".into());
    }
    let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
        .map_err(|_| format!("bad chunk size {line:?}"))?;
    let mut data = vec![0u8; size + 2];
    conn.read_exact(&mut data).await.map_err(|e| format!("read: {e}"))?;
    data.truncate(size);
    Ok(data)
}

/// One request and its whole response.
async fn exchange(
    conn: &mut BufReader<TcpStream>,
    server: &Server,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> Result<(u16, Vec<u8>), String> {
    write_head(conn.get_mut(), server, method, path, body).await?;
    let (status, head) = read_head(conn).await?;
    let mut out = Vec::new();
    if head.chunked {
        loop {
            let c = read_chunk(conn).await?;
            if c.is_empty() {
                break;
            }
            out.extend_from_slice(&c);
        }
    } else if let Some(n) = head.length {
        out.resize(n, 0);
        conn.read_exact(&mut out).await.map_err(|e| format!("read: {e}"))?;
    }
    Ok((status, out))
}

thread_local! {
    /// The poll sessions this worker process holds open: the worker's runtime is one thread.
    static OPEN: std::cell::RefCell<std::collections::HashMap<String, Server>> = Default::default();
}

async fn delete(server: Server, session: String) {
    let Ok(mut conn) = server.open().await else { return };
    let path = format!("{}/poll/{session}", server.base_path);
    let _ = tokio::time::timeout(Duration::from_secs(5), exchange(&mut conn, &server, "DELETE", &path, None)).await;
}

/// Ends every poll session this worker process still holds (`DELETE /poll/{session}`), so that
/// the sessions of a finished run — or of one step of a search — do not linger on the server
/// until they expire, receiving publications. Scenarios call it before their worker returns.
pub async fn end_sessions() {
    let open: Vec<(String, Server)> = OPEN.with(|o| o.borrow_mut().drain().collect());
    let ends = open.into_iter().map(|(session, server)| delete(server, session));
    let _ = tokio::time::timeout(Duration::from_secs(10), futures_util::future::join_all(ends)).await;
}

/// Holds one poll after the other and forwards each non-empty batch as one frame.
async fn poll_task(server: Server, session: String, tx: mpsc::UnboundedSender<Result<Message, String>>) {
    #[derive(Deserialize)]
    struct Batch<'a> {
        seq: u64,
        #[serde(borrow)]
        messages: Vec<&'a RawValue>,
    }
    let mut conn: Option<BufReader<TcpStream>> = None;
    let mut seq = 0u64;
    loop {
        let mut c = match conn.take() {
            Some(c) => c,
            None => match server.open().await {
                Ok(c) => c,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            },
        };
        let path = format!("{}/poll/{session}?ack={seq}", server.base_path);
        let (status, body) = match exchange(&mut c, &server, "GET", &path, None).await {
            Ok(r) => r,
            // The server closed an idle kept-alive connection: poll again on a new one.
            Err(e) if e.starts_with("closed") => continue,
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        conn = Some(c);
        match status {
            200 => {}
            // Superseded by a poll of ours that the server saw first: harmless.
            409 => continue,
            404 => {
                let _ = tx.send(Err("the poll session ended".into()));
                return;
            }
            s => {
                let _ = tx.send(Err(format!("GET /poll: HTTP {s} {}", String::from_utf8_lossy(&body))));
                return;
            }
        }
        let batch: Batch<'_> = match serde_json::from_slice(&body) {
            Ok(b) => b,
            Err(e) => {
                let _ = tx.send(Err(format!("poll batch: {e}")));
                return;
            }
        };
        seq = batch.seq;
        if batch.messages.is_empty() {
            continue;
        }
        let mut frame = String::with_capacity(body.len());
        for (i, m) in batch.messages.iter().enumerate() {
            if i > 0 {
                frame.push('\n');
            }
            frame.push_str(m.get());
        }
        if tx.send(Ok(Message::text(frame))).is_err() {
            return;
        }
    }
}

/// A query parameter's value with everything but unreserved characters percent-encoded.
fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The data of a stream's `subscribed` event as the reply to subscribe command `id`.
fn subscribed_as_reply(data: &[u8], id: u64) -> Option<Vec<u8>> {
    #[derive(Deserialize)]
    struct Subscribed<'a> {
        #[serde(borrow)]
        subscribed: &'a RawValue,
    }
    let s: Subscribed<'_> = serde_json::from_slice(data).ok()?;
    Some(format!("{{\"id\":{id},\"ok\":{}}}", s.subscribed.get()).into_bytes())
}

/// Reads an event stream; each read's events become one frame. `reply_to`: a plain stream's
/// subscribe command, answered by its `subscribed` event.
async fn sse_task(
    mut conn: BufReader<TcpStream>,
    chunked: bool,
    tx: mpsc::UnboundedSender<Result<Message, String>>,
    mut reply_to: Option<u64>,
) {
    let mut text: Vec<u8> = Vec::new();
    let mut data: Vec<u8> = Vec::new();
    loop {
        let got = if chunked {
            read_chunk(&mut conn).await
        } else {
            let mut buf = vec![0u8; 16 * 1024];
            match conn.read(&mut buf).await {
                Ok(n) => {
                    buf.truncate(n);
                    Ok(buf)
                }
                Err(e) => Err(format!("read: {e}")),
            }
        };
        let chunk = match got {
            Ok(c) if c.is_empty() => {
                let _ = tx.send(Err("the event stream ended".into()));
                return;
            }
            Ok(c) => c,
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        text.extend_from_slice(&chunk);
        let mut frame: Vec<u8> = Vec::new();
        let mut start = 0;
        while let Some(nl) = text[start..].iter().position(|b| *b == b'\n') {
            let line = &text[start..start + nl];
            start += nl + 1;
            if line.is_empty() {
                if !data.is_empty() {
                    if !frame.is_empty() {
                        frame.push(b'\n');
                    }
                    match reply_to.and_then(|id| subscribed_as_reply(&data, id)) {
                        Some(reply) => {
                            reply_to = None;
                            data.clear();
                            frame.extend_from_slice(&reply);
                        }
                        None => frame.append(&mut data),
                    }
                }
            } else if let Some(v) = line.strip_prefix(b"data: ") {
                if !data.is_empty() {
                    data.push(b'\n');
                }
                data.extend_from_slice(v);
            }
        }
        text.drain(..start);
        if !frame.is_empty() {
            let Ok(frame) = String::from_utf8(frame) else {
                let _ = tx.send(Err("event stream is not UTF-8".into()));
                return;
            };
            if tx.send(Ok(Message::text(frame))).is_err() {
                return;
            }
        }
    }
}
