//! [`Client`]: one WebSocket connection speaking protocol v1.
//!
//! Commands are written by a writer task fed through a channel, so every method takes `&self`
//! and a `Client` can be shared (e.g. in an `Arc`) by tasks issuing commands concurrently.
//! A reader task splits incoming frames, hands each reply to the command waiting for its id
//! and queues everything else as an [`Event`].

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use switchboard_protocol::message::ErrorBody;
use switchboard_protocol::{Format, StreamPosition};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;

use crate::connect::{handshake, ConnectOptions, WsStream};
use crate::delta::{Chains, DEFAULT_MAX_BYTES};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::frame::{decode_frame, ServerMessage};
use crate::reply::{
    ConnectReply, HistoryReply, PresenceReply, PublishReply, RefreshReply, SubscribeOptions, SubscribeReply,
};
use crate::wire::WireStats;

/// The close code reported when a connection ends without a close frame (RFC 6455 §7.1.5).
pub const ABNORMAL_CLOSE: u16 = 1006;

type ReplySender = oneshot::Sender<std::result::Result<Value, ErrorBody>>;

/// State shared by the caller side and the reader task.
///
/// The pending map and the closed flag sit under one lock so that a command registered after
/// the reader has drained the map on close cannot wait forever: it sees `closed` instead. A
/// `std` mutex is right here: it is never held across an `.await` and the critical sections
/// are a map insert or remove.
struct Shared {
    state: Mutex<State>,
    /// The largest publication text a delta-encoded push may declare ([`Client::set_max_delta_bytes`]).
    max_delta_bytes: AtomicUsize,
}

impl Default for Shared {
    fn default() -> Shared {
        Shared { state: Mutex::default(), max_delta_bytes: AtomicUsize::new(DEFAULT_MAX_BYTES) }
    }
}

#[derive(Default)]
struct State {
    pending: HashMap<u32, ReplySender>,
    /// `Some(code)` once the connection has ended.
    closed: Option<u16>,
    /// The server's close reason (empty when it gave none).
    reason: String,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock leaves the map consistent (single insert/remove), so
        // recovering from poisoning is safe.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`Error::Closed`] with the close code and reason, once the connection has ended (1006
    /// and no reason before the reader has recorded them).
    fn closed_error(&self) -> Error {
        let st = self.lock();
        Error::Closed { code: st.closed.unwrap_or(ABNORMAL_CLOSE), reason: st.reason.clone() }
    }
}

/// The receiving end of a connection's server pushes.
///
/// Unbounded on purpose: the reader task must never stall on a slow event consumer, or replies
/// behind the queued events would stall too and a caller awaiting one could deadlock.
pub struct Events {
    rx: mpsc::UnboundedReceiver<Event>,
}

impl Events {
    /// The next event; `None` after [`Event::Closed`] has been returned.
    pub async fn recv(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// An event if one is already queued.
    pub fn try_recv(&mut self) -> Option<Event> {
        self.rx.try_recv().ok()
    }
}

/// A Switchboard WebSocket connection.
///
/// Dropping the client closes the connection (close code 1000) once queued commands are sent.
pub struct Client {
    format: Format,
    next_id: AtomicU32,
    out: mpsc::UnboundedSender<Message>,
    shared: Arc<Shared>,
    events: Option<Events>,
    reader: Option<JoinHandle<()>>,
    request_timeout: Duration,
    wire: Arc<WireStats>,
}

impl Client {
    /// Connects to `url` (`ws://host:port/ws`) offering the subprotocol of `format`.
    pub async fn connect(url: &str, format: Format) -> Result<Client> {
        Self::connect_with(url, &ConnectOptions::new(format)).await
    }

    /// Connects with explicit options (token, source address, timeouts).
    pub async fn connect_with(url: &str, opts: &ConnectOptions) -> Result<Client> {
        let ws = handshake(url, opts).await?;
        Ok(Self::from_stream(ws, opts.format))
    }

    /// Wraps an already upgraded connection. Must be called inside a Tokio runtime.
    pub fn from_stream(ws: WsStream, format: Format) -> Client {
        let wire = ws.get_ref().stats().clone();
        let (sink, stream) = ws.split();
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let (ev_tx, ev_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared::default());
        tokio::spawn(write_loop(sink, out_rx));
        let reader = tokio::spawn(read_loop(stream, shared.clone(), ev_tx));
        Client {
            format,
            next_id: AtomicU32::new(1),
            out: out_tx,
            shared,
            events: Some(Events { rx: ev_rx }),
            reader: Some(reader),
            request_timeout: Duration::from_secs(30),
            wire,
        }
    }

    /// What crossed the connection so far: bytes read and written, and whether the node
    /// accepted permessage-deflate.
    pub fn wire(&self) -> &WireStats {
        &self.wire
    }

    /// The wire format of this connection.
    pub fn format(&self) -> Format {
        self.format
    }

    /// How long a command waits for its reply before failing with [`Error::Timeout`]
    /// (default 30 s).
    pub fn set_request_timeout(&mut self, timeout: Duration) {
        self.request_timeout = timeout;
    }

    /// The largest publication text a push of a `delta: "fossil"` subscription may declare
    /// (default [`DEFAULT_MAX_BYTES`], 1 MiB); a larger one is refused before it is rebuilt,
    /// as [`Event::DeltaFailed`].
    pub fn set_max_delta_bytes(&self, max: usize) {
        self.shared.max_delta_bytes.store(max, Ordering::Relaxed);
    }

    /// The next server push, or `None` once the connection has ended (after
    /// [`Event::Closed`]) or when the events were taken with [`Client::take_events`].
    pub async fn next_event(&mut self) -> Option<Event> {
        match &mut self.events {
            Some(ev) => ev.recv().await,
            None => None,
        }
    }

    /// Moves the event stream out, e.g. into its own task, while commands go on through
    /// `&self`.
    pub fn take_events(&mut self) -> Option<Events> {
        self.events.take()
    }

    /// Whether the connection has ended; `Some(close code)` if so.
    pub fn closed(&self) -> Option<u16> {
        self.shared.lock().closed
    }

    fn next_id(&self) -> u32 {
        loop {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            // Id 0 is the server's "no id" marker for errors of id-less commands.
            if id != 0 {
                return id;
            }
        }
    }

    fn encode(&self, command: &impl Serialize) -> Result<Message> {
        Ok(match self.format {
            Format::Json => Message::text(serde_json::to_string(command).map_err(|e| Error::Decode(e.to_string()))?),
            Format::Msgpack => {
                Message::binary(rmp_serde::to_vec_named(command).map_err(|e| Error::Decode(e.to_string()))?)
            }
        })
    }

    /// Sends `{"id": <new id>, "<command>": body}` and waits for the reply's `ok` body.
    pub async fn request<B: Serialize>(&self, command: &str, body: &B) -> Result<Value> {
        let id = self.next_id();
        let msg = self.encode(&Envelope { id: Some(id), command, body })?;
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.shared.lock();
            if st.closed.is_some() {
                drop(st);
                return Err(self.shared.closed_error());
            }
            st.pending.insert(id, tx);
        }
        if self.out.send(msg).is_err() {
            self.shared.lock().pending.remove(&id);
            return Err(self.shared.closed_error());
        }
        match tokio::time::timeout(self.request_timeout, rx).await {
            Ok(Ok(Ok(body))) => Ok(body),
            Ok(Ok(Err(e))) => Err(Error::Reply(e)),
            // The reader dropped the sender: the connection ended.
            Ok(Err(_)) => Err(self.shared.closed_error()),
            Err(_) => {
                self.shared.lock().pending.remove(&id);
                Err(Error::Timeout)
            }
        }
    }

    /// Like [`Client::request`] but decodes the `ok` body into `T`.
    pub async fn request_typed<B: Serialize, T: DeserializeOwned>(&self, command: &str, body: &B) -> Result<T> {
        let v = self.request(command, body).await?;
        serde_json::from_value(v).map_err(|e| Error::Decode(format!("{command} reply: {e}")))
    }

    /// Sends a command without id: the server replies only if it fails (as [`Event::Error`]).
    pub fn notify<B: Serialize>(&self, command: &str, body: &B) -> Result<()> {
        let msg = self.encode(&Envelope { id: None, command, body })?;
        self.out.send(msg).map_err(|_| self.shared.closed_error())
    }

    /// Sends a raw text frame (tests of malformed input).
    pub fn send_text(&self, text: impl Into<String>) -> Result<()> {
        self.out.send(Message::text(text.into())).map_err(|_| self.shared.closed_error())
    }

    /// Sends a raw binary frame (tests of malformed input).
    pub fn send_binary(&self, bytes: impl Into<Vec<u8>>) -> Result<()> {
        self.out.send(Message::binary(bytes.into())).map_err(|_| self.shared.closed_error())
    }

    /// `connect`: authenticates with a token when none was given at the handshake.
    pub async fn connect_cmd(&self, token: Option<&str>, name: Option<&str>) -> Result<ConnectReply> {
        let mut body = serde_json::Map::new();
        if let Some(t) = token {
            body.insert("token".into(), json!(t));
        }
        if let Some(n) = name {
            body.insert("name".into(), json!(n));
        }
        self.request_typed("connect", &body).await
    }

    /// `subscribe`: one command. Per-channel failures are in the reply
    /// ([`SubscribeReply::errors`]), not an `Err`; channels refused past the reply's byte
    /// budget (413) are subscribed by [`Client::subscribe_all`] (in `resubscribe`, beside the
    /// rule it follows).
    pub async fn subscribe(&self, options: SubscribeOptions) -> Result<SubscribeReply> {
        self.request_typed("subscribe", &options).await
    }

    /// `unsubscribe`.
    pub async fn unsubscribe<I, S>(&self, channels: I) -> Result<()>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let channels: Vec<String> = channels.into_iter().map(Into::into).collect();
        self.request("unsubscribe", &json!({ "channels": channels })).await.map(|_| ())
    }

    /// `publish` (the namespace must allow client publishing).
    pub async fn publish(&self, channel: &str, data: Value) -> Result<PublishReply> {
        self.request_typed("publish", &json!({ "channel": channel, "data": data })).await
    }

    /// `publish` with the publisher's tags beside the data: what subscriptions' `filter`
    /// compares (the `filter` of [`SubscribeOptions`]).
    pub async fn publish_tagged(
        &self,
        channel: &str,
        data: Value,
        tags: &BTreeMap<String, String>,
    ) -> Result<PublishReply> {
        self.request_typed("publish", &json!({ "channel": channel, "data": data, "tags": tags })).await
    }

    /// `history`: publications after `since` (all kept ones when `None`), at most `limit`.
    pub async fn history(
        &self,
        channel: &str,
        since: Option<StreamPosition>,
        limit: Option<usize>,
    ) -> Result<HistoryReply> {
        let mut body = serde_json::Map::new();
        body.insert("channel".into(), json!(channel));
        if let Some(s) = since {
            body.insert("since".into(), json!(s));
        }
        if let Some(l) = limit {
            body.insert("limit".into(), json!(l));
        }
        self.request_typed("history", &body).await
    }

    /// `presence`: who is subscribed to `channel`.
    pub async fn presence(&self, channel: &str) -> Result<PresenceReply> {
        self.request_typed("presence", &json!({ "channel": channel })).await
    }

    /// `ping`: the server echoes `data` back.
    pub async fn ping(&self, data: Value) -> Result<Value> {
        let mut reply = self.request("ping", &json!({ "data": data })).await?;
        Ok(reply.get_mut("data").map(Value::take).unwrap_or(Value::Null))
    }

    /// `refresh`: replaces the connection's token before it expires.
    pub async fn refresh(&self, token: &str) -> Result<RefreshReply> {
        self.request_typed("refresh", &json!({ "token": token })).await
    }

    /// Closes the connection (code 1000) and waits up to 5 s for the server's close.
    pub async fn close(mut self) -> Result<()> {
        let _ = self.out.send(Message::Close(None));
        if let Some(reader) = self.reader.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
        }
        Ok(())
    }
}

/// `{"id": .., "<command>": body}` without building a map.
struct Envelope<'a, B> {
    id: Option<u32>,
    command: &'a str,
    body: &'a B,
}

impl<B: Serialize> Serialize for Envelope<'_, B> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(if self.id.is_some() { 2 } else { 1 }))?;
        if let Some(id) = self.id {
            m.serialize_entry("id", &id)?;
        }
        m.serialize_entry(self.command, self.body)?;
        m.end()
    }
}

async fn write_loop(mut sink: SplitSink<WsStream, Message>, mut rx: mpsc::UnboundedReceiver<Message>) {
    while let Some(msg) = rx.recv().await {
        let is_close = matches!(msg, Message::Close(_));
        if sink.send(msg).await.is_err() || is_close {
            return;
        }
    }
    // Every sender is gone: the client was dropped. Say goodbye properly.
    let _ = sink.close().await;
}

async fn read_loop(mut stream: SplitStream<WsStream>, shared: Arc<Shared>, events: mpsc::UnboundedSender<Event>) {
    let mut close_code = ABNORMAL_CLOSE;
    let mut close_reason = String::new();
    // Delta-encoded pushes are rebuilt here, in arrival order: each builds on the one before.
    let mut chains = Chains::default();
    while let Some(msg) = stream.next().await {
        let (format, payload) = match &msg {
            Ok(Message::Text(t)) => (Format::Json, t.as_bytes()),
            Ok(Message::Binary(b)) => (Format::Msgpack, &b[..]),
            Ok(Message::Close(frame)) => {
                close_code = frame.as_ref().map(|f| u16::from(f.code)).unwrap_or(1005);
                close_reason = frame.as_ref().map(|f| f.reason.to_string()).unwrap_or_default();
                // Keep reading: the stream ends once the close handshake completes.
                continue;
            }
            Ok(_) => continue,
            Err(_) => break,
        };
        for m in decode_frame(format, payload) {
            match m {
                Ok(ServerMessage::Reply { id, result }) => {
                    let waiter = shared.lock().pending.remove(&id);
                    match (waiter, result) {
                        (Some(tx), result) => {
                            let _ = tx.send(result);
                        }
                        // A late error reply (its command timed out) is still worth surfacing.
                        (None, Err(e)) => {
                            let _ = events.send(Event::Error(e));
                        }
                        (None, Ok(_)) => {}
                    }
                }
                Ok(ServerMessage::Event(ev)) => {
                    let _ = events.send(ev);
                }
                Ok(ServerMessage::Encoded(push)) => {
                    chains.set_max(shared.max_delta_bytes.load(Ordering::Relaxed));
                    let (ch, off) = (push.ch.clone(), push.off);
                    let ev = match chains.decode(push) {
                        Ok(p) => Event::Publication(p),
                        Err(error) => Event::DeltaFailed { ch, off, error },
                    };
                    let _ = events.send(ev);
                }
                // An undecodable message is skipped; the connection stays usable.
                Err(e) => tracing::warn!(error = %e, "undecodable message from the server"),
            }
        }
    }
    let drained: Vec<ReplySender> = {
        let mut st = shared.lock();
        st.closed = Some(close_code);
        st.reason = close_reason.clone();
        st.pending.drain().map(|(_, tx)| tx).collect()
    };
    // Dropping the senders wakes every waiting command with "closed".
    drop(drained);
    let _ = events.send(Event::Closed { code: close_code, reason: close_reason });
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A scripted server: accepts one connection and answers each command with `respond`
    /// (also the delta tests' server).
    #[allow(clippy::result_large_err)] // the handshake callback's error type is tungstenite's
    pub(crate) async fn scripted_server<F>(respond: F) -> String
    where
        F: Fn(Value) -> Vec<Message> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let cb = |req: &tokio_tungstenite::tungstenite::handshake::server::Request,
                      mut resp: tokio_tungstenite::tungstenite::handshake::server::Response| {
                if let Some(p) = req.headers().get("sec-websocket-protocol") {
                    resp.headers_mut().insert("sec-websocket-protocol", p.clone());
                }
                Ok(resp)
            };
            let mut ws = tokio_tungstenite::accept_hdr_async(tcp, cb).await.unwrap();
            while let Some(Ok(msg)) = ws.next().await {
                let cmd: Value = match msg {
                    Message::Text(t) => serde_json::from_str(t.as_str()).unwrap(),
                    Message::Binary(b) => rmp_serde::from_slice(&b).unwrap(),
                    Message::Close(_) => break,
                    _ => continue,
                };
                for reply in respond(cmd) {
                    ws.send(reply).await.unwrap();
                }
            }
        });
        format!("ws://{addr}/ws")
    }

    #[tokio::test]
    async fn client_matches_out_of_order_replies_by_id() {
        // Holds the first ping's reply back and answers it together with the second's, in
        // reverse order, in one batched frame with a publication between them.
        let held = Arc::new(Mutex::new(None::<Value>));
        let url = scripted_server(move |cmd| {
            let id = cmd["id"].as_u64().unwrap();
            let data = cmd["ping"]["data"].clone();
            let mut h = held.lock().unwrap();
            match h.take() {
                None => {
                    *h = Some(json!({"id": id, "ok": {"data": data}}));
                    vec![]
                }
                Some(first) => {
                    let second = json!({"id": id, "ok": {"data": data}});
                    let pushed = json!({"pub": {"ch": "a", "off": 1, "data": "between"}});
                    vec![Message::text(format!("{second}\n{pushed}\n{first}"))]
                }
            }
        })
        .await;
        let mut client = Client::connect(&url, Format::Json).await.unwrap();
        let (a, b) = tokio::join!(client.ping(json!("one")), async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            client.ping(json!("two")).await
        });
        assert_eq!(a.unwrap(), json!("one"));
        assert_eq!(b.unwrap(), json!("two"));
        let ev = client.next_event().await.unwrap();
        assert!(matches!(ev, Event::Publication(ref p) if p.data == json!("between")), "{ev:?}");
    }

    #[tokio::test]
    async fn client_reports_error_replies_and_msgpack_pushes() {
        let url = scripted_server(|cmd| {
            let id = cmd["id"].clone();
            let reply = if cmd.get("publish").is_some() {
                json!({"id": id, "error": {"code": 403, "message": "forbidden"}})
            } else {
                json!({"id": id, "ok": {"channels": {"a": {"epoch": "e", "offset": 0, "last": null, "recovered": [], "complete": true}}}})
            };
            let mut frame = rmp_serde::to_vec_named(&reply).unwrap();
            frame.extend(rmp_serde::to_vec_named(&json!({"pub": {"ch": "a", "off": 1, "data": {"k": [1, 2]}}})).unwrap());
            vec![Message::binary(frame)]
        })
        .await;
        let mut client = Client::connect(&url, Format::Msgpack).await.unwrap();
        let sub = client.subscribe(SubscribeOptions::new(["a"])).await.unwrap();
        assert_eq!(sub.errors().count(), 0);
        let err = client.publish("a", json!(1)).await.unwrap_err();
        assert_eq!(err.code(), Some(403));
        for _ in 0..2 {
            let ev = client.next_event().await.unwrap();
            assert!(matches!(ev, Event::Publication(ref p) if p.data == json!({"k": [1, 2]})), "{ev:?}");
        }
    }

    #[tokio::test]
    async fn client_fails_pending_commands_when_the_server_closes() {
        let url = scripted_server(|_| {
            vec![Message::Close(Some(tokio_tungstenite::tungstenite::protocol::CloseFrame {
                code: 4000.into(),
                reason: "shutting down".into(),
            }))]
        })
        .await;
        let mut client = Client::connect(&url, Format::Json).await.unwrap();
        let err = client.ping(json!(null)).await.unwrap_err();
        assert!(matches!(err, Error::Closed { code: 4000, ref reason } if reason == "shutting down"), "{err:?}");
        assert_eq!(err.to_string(), "connection closed (code 4000: shutting down)");
        assert_eq!(client.next_event().await, Some(Event::Closed { code: 4000, reason: "shutting down".into() }));
        assert!(matches!(client.ping(json!(1)).await, Err(Error::Closed { code: 4000, .. })));
    }
}
