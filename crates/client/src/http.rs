//! A minimal HTTP/1.1 client for the HTTP API (SPEC §4): JSON requests over one kept-alive
//! connection, plain or TLS (through the WebSocket handshake's connector,
//! [`crate::connect::connect_stream`]). Small on purpose: the API needs `GET`/`POST` with JSON
//! bodies, nothing more, and the bench must not pay for a general-purpose HTTP stack.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use switchboard_protocol::message::ErrorBody;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio_tungstenite::tungstenite::http::HeaderValue;

use crate::connect::{connect_stream, Credentials, Endpoint};
use crate::error::{Error, Result};
use crate::reply::PublishReply;
use crate::tls::{MaybeTls, TlsConfig};

/// Largest response body accepted.
const MAX_BODY: usize = 64 << 20;
/// Largest status line plus headers accepted.
const MAX_HEAD: usize = 64 << 10;

/// A handle on the HTTP API of one node, e.g. `http://127.0.0.1:8700` or
/// `https://node.example`.
///
/// Requests through one `HttpApi` are sequential (HTTP/1.1 without pipelining); clone-free
/// sharing is fine, concurrent callers simply queue. Use several `HttpApi`s for parallel load.
pub struct HttpApi {
    endpoint: Endpoint,
    /// Sent as `Authorization` with every request.
    credentials: Option<Credentials>,
    tls: Option<TlsConfig>,
    timeout: Duration,
    /// The kept-alive connection. A Tokio mutex because it is held across the whole exchange
    /// (write request, read response), which awaits.
    conn: tokio::sync::Mutex<Option<BufReader<MaybeTls>>>,
}

/// A response: status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl HttpApi {
    /// `base` names the node in any form [`Endpoint::api`] takes: `http(s)://host[:port]`
    /// with an optional path prefix, or the node's `ws(s)://` URL. A `user:password@` in it is
    /// sent as Basic credentials unless [`HttpApi::with_credentials`] says otherwise.
    pub fn new(base: &str) -> Result<HttpApi> {
        let endpoint = Endpoint::parse(base)?;
        let credentials = Credentials::from_url(&endpoint)?;
        Ok(HttpApi {
            endpoint: endpoint.api(),
            credentials,
            tls: None,
            timeout: Duration::from_secs(30),
            conn: tokio::sync::Mutex::new(None),
        })
    }

    /// Sends `Authorization: Bearer <token>` (an API key or a JWT) with every request.
    pub fn with_token(self, token: impl Into<String>) -> Self {
        self.with_credentials(Credentials::Bearer(token.into()))
    }

    /// Sends these credentials with every request (credentials a header cannot carry fail
    /// each request).
    pub fn with_credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// Verifies `https://` nodes against these roots instead of the system's.
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The API base requests go to (shown without a password).
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Per-request deadline (default 30 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// `POST /api/publish` `{"channel", "data"}`.
    pub async fn publish(&self, channel: &str, data: &Value) -> Result<PublishReply> {
        let v = self.post("/api/publish", &json!({ "channel": channel, "data": data })).await?;
        serde_json::from_value(v).map_err(|e| Error::Decode(format!("publish reply: {e}")))
    }

    /// `POST /api/publish` `{"batch": [...]}`: one result per item, in order.
    pub async fn publish_batch(&self, items: &[(String, Value)]) -> Result<Vec<Result<PublishReply, ErrorBody>>> {
        let batch: Vec<Value> = items.iter().map(|(ch, data)| json!({ "channel": ch, "data": data })).collect();
        let v = self.post("/api/publish", &json!({ "batch": batch })).await?;
        #[derive(Deserialize)]
        struct Batch {
            results: Vec<Item>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Item {
            Err { error: ErrorBody },
            Ok(PublishReply),
        }
        let b: Batch = serde_json::from_value(v).map_err(|e| Error::Decode(format!("batch reply: {e}")))?;
        Ok(b.results
            .into_iter()
            .map(|i| match i {
                Item::Ok(r) => Ok(r),
                Item::Err { error } => Err(error),
            })
            .collect())
    }

    /// `GET path`, expecting a 2xx JSON body.
    pub async fn get(&self, path: &str) -> Result<Value> {
        json_body(self.request("GET", path, None).await?)
    }

    /// `POST path` with a JSON body, expecting a 2xx JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let bytes = serde_json::to_vec(body).map_err(|e| Error::Decode(e.to_string()))?;
        json_body(self.request("POST", path, Some(&bytes)).await?)
    }

    /// One exchange; any status is returned as is.
    ///
    /// A kept-alive connection that fails before any response byte arrives is replaced and
    /// the request sent once more: that is the server having closed an idle connection, and
    /// the request was not processed. Failures after that are returned, never retried, so a
    /// publish is never sent twice.
    pub async fn request(&self, method: &str, path: &str, body: Option<&[u8]>) -> Result<Response> {
        let authorization = self.credentials.as_ref().map(Credentials::header_value).transpose()?;
        let head = self.head(method, path, body.map(<[u8]>::len), authorization.as_ref());
        let mut slot = self.conn.lock().await;
        let exchange = async {
            let reused = slot.is_some();
            let mut conn = match slot.take() {
                Some(c) => c,
                None => self.open().await?,
            };
            match exchange(&mut conn, &head, body).await {
                Ok((resp, keep)) => {
                    if keep {
                        *slot = Some(conn);
                    }
                    Ok(resp)
                }
                Err(Failure::BeforeResponse(_)) if reused => {
                    let mut conn = self.open().await?;
                    let (resp, keep) = exchange(&mut conn, &head, body).await.map_err(Failure::into_error)?;
                    if keep {
                        *slot = Some(conn);
                    }
                    Ok(resp)
                }
                Err(f) => Err(f.into_error()),
            }
        };
        tokio::time::timeout(self.timeout, exchange).await.map_err(|_| Error::Timeout)?
    }

    async fn open(&self) -> Result<BufReader<MaybeTls>> {
        Ok(BufReader::new(connect_stream(&self.endpoint, None, self.tls.as_ref()).await?))
    }

    fn head(&self, method: &str, path: &str, body_len: Option<usize>, authorization: Option<&HeaderValue>) -> String {
        let prefix = self.endpoint.path.split('?').next().unwrap_or("").trim_end_matches('/');
        let mut h = format!(
            "{method} {prefix}{path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: switchboard-client/{}\r\nAccept: application/json\r\n",
            self.endpoint.authority(),
            env!("CARGO_PKG_VERSION"),
        );
        if let Some(a) = authorization.and_then(|v| v.to_str().ok()) {
            h.push_str(&format!("Authorization: {a}\r\n"));
        }
        match body_len {
            Some(n) => h.push_str(&format!("Content-Type: application/json\r\nContent-Length: {n}\r\n")),
            None if method != "GET" && method != "HEAD" => h.push_str("Content-Length: 0\r\n"),
            None => {}
        }
        h.push_str("\r\n");
        h
    }
}

/// `POST {api_base}/api/publish` `{"channel", "data"}` on a fresh connection.
pub async fn http_publish(api_base: &str, channel: &str, data: &Value) -> Result<PublishReply> {
    HttpApi::new(api_base)?.publish(channel, data).await
}

/// `POST {api_base}/api/publish` `{"batch": [...]}` on a fresh connection.
pub async fn http_publish_batch(
    api_base: &str,
    items: &[(String, Value)],
) -> Result<Vec<Result<PublishReply, ErrorBody>>> {
    HttpApi::new(api_base)?.publish_batch(items).await
}

fn json_body(resp: Response) -> Result<Value> {
    if !(200..300).contains(&resp.status) {
        return Err(Error::Http { status: resp.status, body: String::from_utf8_lossy(&resp.body).into_owned() });
    }
    if resp.body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&resp.body).map_err(|e| Error::Decode(format!("HTTP body: {e}")))
}

enum Failure {
    /// Nothing of a response was read: the request was not answered.
    BeforeResponse(std::io::Error),
    After(Error),
}

impl Failure {
    fn into_error(self) -> Error {
        match self {
            Failure::BeforeResponse(e) => Error::Io(e),
            Failure::After(e) => e,
        }
    }
}

/// Writes the request and reads the response; returns whether the connection may be reused.
async fn exchange(
    conn: &mut BufReader<MaybeTls>,
    head: &str,
    body: Option<&[u8]>,
) -> std::result::Result<(Response, bool), Failure> {
    let s = conn.get_mut();
    s.write_all(head.as_bytes()).await.map_err(Failure::BeforeResponse)?;
    if let Some(b) = body {
        s.write_all(b).await.map_err(Failure::BeforeResponse)?;
    }
    let mut line = String::new();
    let n = conn.read_line(&mut line).await.map_err(Failure::BeforeResponse)?;
    if n == 0 {
        return Err(Failure::BeforeResponse(std::io::ErrorKind::UnexpectedEof.into()));
    }
    read_response(conn, line).await.map_err(Failure::After)
}

async fn read_response<R: tokio::io::AsyncBufRead + Unpin>(
    conn: &mut R,
    status_line: String,
) -> Result<(Response, bool)> {
    let bad = |what: &str| Error::Decode(format!("HTTP response: {what}"));
    let mut parts = status_line.split_whitespace();
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        return Err(bad("not HTTP/1.x"));
    }
    let status: u16 = parts.next().and_then(|s| s.parse().ok()).ok_or_else(|| bad("no status code"))?;
    let mut keep_alive = version == "HTTP/1.1";
    let mut content_length: Option<usize> = None;
    let mut chunked = false;
    let mut head_len = status_line.len();
    loop {
        let mut line = String::new();
        let n = conn.read_line(&mut line).await?;
        head_len += n;
        if n == 0 || head_len > MAX_HEAD {
            return Err(bad("truncated or oversized headers"));
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(bad("malformed header"));
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => content_length = Some(value.parse().map_err(|_| bad("bad content-length"))?),
            "transfer-encoding" => chunked = value.to_ascii_lowercase().contains("chunked"),
            "connection" => {
                let v = value.to_ascii_lowercase();
                if v.contains("close") {
                    keep_alive = false;
                } else if v.contains("keep-alive") {
                    keep_alive = true;
                }
            }
            _ => {}
        }
    }
    let body = if chunked {
        read_chunked(conn).await?
    } else if let Some(n) = content_length {
        if n > MAX_BODY {
            return Err(bad("body too large"));
        }
        let mut body = vec![0; n];
        conn.read_exact(&mut body).await?;
        body
    } else if status == 204 || status == 304 || (100..200).contains(&status) {
        Vec::new()
    } else {
        // No length: the body runs to the end of the connection.
        keep_alive = false;
        let mut body = Vec::new();
        conn.take(MAX_BODY as u64).read_to_end(&mut body).await?;
        body
    };
    Ok((Response { status, body }, keep_alive))
}

async fn read_chunked<R: tokio::io::AsyncBufRead + Unpin>(conn: &mut R) -> Result<Vec<u8>> {
    let bad = |what: &str| Error::Decode(format!("HTTP chunked body: {what}"));
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        if conn.read_line(&mut line).await? == 0 {
            return Err(bad("truncated"));
        }
        let size_hex = line.trim().split(';').next().unwrap_or("");
        let size = usize::from_str_radix(size_hex, 16).map_err(|_| bad("bad chunk size"))?;
        if body.len() + size > MAX_BODY {
            return Err(bad("body too large"));
        }
        if size == 0 {
            // Trailers, up to the empty line.
            loop {
                let mut t = String::new();
                if conn.read_line(&mut t).await? == 0 || t.trim().is_empty() {
                    return Ok(body);
                }
            }
        }
        let start = body.len();
        body.resize(start + size, 0);
        conn.read_exact(&mut body[start..]).await?;
        let mut crlf = [0u8; 2];
        conn.read_exact(&mut crlf).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    async fn parse(raw: &[u8]) -> Result<(Response, bool)> {
        let mut r = BufReader::new(raw);
        let mut line = String::new();
        r.read_line(&mut line).await?;
        read_response(&mut r, line).await
    }

    #[tokio::test]
    async fn http_parses_length_chunked_and_close_delimited_bodies() {
        let (r, keep) = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}").await.unwrap();
        assert_eq!((r.status, r.body.as_slice(), keep), (200, &b"{}"[..], true));
        let (r, keep) =
            parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;x=y\r\n\":1}\r\n0\r\n\r\n")
                .await
                .unwrap();
        assert_eq!((r.body.as_slice(), keep), (&b"{\"a\":1}"[..], true));
        let (r, keep) = parse(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\nnope").await.unwrap();
        assert_eq!((r.status, r.body.as_slice(), keep), (400, &b"nope"[..], false));
        assert!(parse(b"SSH-2.0\r\n\r\n").await.is_err());
    }

    #[tokio::test]
    async fn http_publish_reuses_the_connection_and_reads_batches() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            // One connection serves both requests: keep-alive works.
            let (tcp, _) = listener.accept().await.unwrap();
            let mut conn = BufReader::new(tcp);
            let mut requests = Vec::new();
            for reply in [
                r#"{"offset":5,"epoch":"e1"}"#,
                r#"{"results":[{"offset":6,"epoch":"e1"},{"error":{"code":400,"message":"bad channel"}}]}"#,
            ] {
                let mut head = String::new();
                let mut len = 0;
                loop {
                    let mut line = String::new();
                    conn.read_line(&mut line).await.unwrap();
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap();
                    }
                    head.push_str(&line);
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0; len];
                conn.read_exact(&mut body).await.unwrap();
                requests.push((head, String::from_utf8(body).unwrap()));
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{reply}",
                    reply.len()
                );
                conn.get_mut().write_all(resp.as_bytes()).await.unwrap();
            }
            requests
        });
        let api = HttpApi::new(&format!("http://{addr}")).unwrap().with_token("k");
        let r = api.publish("room:1", &json!({"x": 1})).await.unwrap();
        assert_eq!(r, PublishReply::published(5, "e1"));
        let rs = api.publish_batch(&[("room:1".into(), json!(2)), ("bad channel".into(), json!(3))]).await.unwrap();
        assert_eq!(rs[0], Ok(PublishReply::published(6, "e1")));
        assert_eq!(rs[1].as_ref().unwrap_err().code, 400);
        let requests = server.await.unwrap();
        assert!(requests[0].0.starts_with("POST /api/publish HTTP/1.1\r\n"));
        assert!(requests[0].0.contains("Authorization: Bearer k\r\n"));
        let body: Value = serde_json::from_str(&requests[0].1).unwrap();
        assert_eq!(body, json!({"channel": "room:1", "data": {"x": 1}}));
        let body: Value = serde_json::from_str(&requests[1].1).unwrap();
        assert_eq!(body["batch"][1], json!({"channel": "bad channel", "data": 3}));
    }
}
