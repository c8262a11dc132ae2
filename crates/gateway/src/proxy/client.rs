//! [`HttpClient`]: the node's outgoing HTTP — hook calls and JWKS fetches — over one pool of
//! keep-alive connections per host (`http://` and `https://`, verified against the system's
//! root certificates).
//!
//! Every call has a deadline covering connect, request and the whole answer, and answers are
//! read up to [`MAX_ANSWER_BYTES`]: a backend that hangs or streams forever costs a timeout,
//! never a task or unbounded memory.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderValue, ACCEPT, CONTENT_TYPE, USER_AGENT};
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Largest answer read from a hook or an identity provider.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;
/// Idle connections kept per host: enough for the calls of a connection storm to reuse them.
const IDLE_PER_HOST: usize = 256;
/// How long an idle pooled connection is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// A pooled HTTP/1.1 client. Cheap to clone (the pool is shared).
#[derive(Clone)]
pub struct HttpClient {
    inner: Client<Connector, Full<Bytes>>,
}

/// Why a call got no usable answer. The texts name no secret (URLs of hooks are
/// configuration, not credentials, but they are still left out of client-facing messages by
/// the callers).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("no answer within {0} ms")]
    Timeout(u64),
    #[error("unreachable: {0}")]
    Unreachable(String),
    #[error("answered HTTP {0}")]
    Status(u16),
    #[error("answer larger than {MAX_ANSWER_BYTES} bytes or cut short")]
    Body,
}

impl HttpClient {
    pub fn new() -> HttpClient {
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        // Without any system root certificate, `https://` calls fail verification (and are
        // counted as failures); `http://` works either way.
        let builder = match builder.with_native_roots() {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!("no system root certificates ({e}): https:// hooks and JWKS URLs will fail");
                let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .map(|b| b.with_root_certificates(rustls::RootCertStore::empty()).with_no_client_auth());
                match config {
                    Ok(c) => hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(c),
                    // The ring provider supports the default versions; kept total anyway.
                    Err(_) => hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(
                        rustls::ClientConfig::builder()
                            .with_root_certificates(rustls::RootCertStore::empty())
                            .with_no_client_auth(),
                    ),
                }
            }
        };
        let connector = builder.https_or_http().enable_http1().build();
        let inner = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(IDLE_TIMEOUT)
            .pool_max_idle_per_host(IDLE_PER_HOST)
            .build(connector);
        HttpClient { inner }
    }

    /// `POST url` with a JSON body; the answer's body when the status is 2xx.
    pub async fn post_json(&self, url: &Uri, body: Vec<u8>, timeout: Duration) -> Result<Bytes, CallError> {
        self.call(Method::POST, url, Bytes::from(body), timeout).await
    }

    /// `GET url`; the answer's body when the status is 2xx.
    pub async fn get(&self, url: &Uri, timeout: Duration) -> Result<Bytes, CallError> {
        self.call(Method::GET, url, Bytes::new(), timeout).await
    }

    async fn call(&self, method: Method, url: &Uri, body: Bytes, timeout: Duration) -> Result<Bytes, CallError> {
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = method;
        *req.uri_mut() = url.clone();
        let h = req.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.insert(ACCEPT, HeaderValue::from_static("application/json"));
        h.insert(USER_AGENT, HeaderValue::from_static(concat!("switchboard/", env!("CARGO_PKG_VERSION"))));
        let exchange = async {
            let resp = self.inner.request(req).await.map_err(|e| CallError::Unreachable(error_chain(&e)))?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), MAX_ANSWER_BYTES).collect().await.map_err(|_| CallError::Body)?;
            if !status.is_success() {
                return Err(CallError::Status(status.as_u16()));
            }
            Ok(body.to_bytes())
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Timeout(timeout.as_millis() as u64)),
        }
    }
}

impl Default for HttpClient {
    fn default() -> HttpClient {
        HttpClient::new()
    }
}

/// The error and its sources on one line ("client error (Connect): tcp connect error: ...").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Parses a configured `http://` or `https://` URL; `Err` says what is wrong with it.
pub fn parse_url(text: &str) -> Result<Uri, String> {
    let uri: Uri = text.parse().map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err(format!("{text:?}: only http:// and https:// URLs are supported")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{text:?} names no host"));
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_urls_must_be_http_with_a_host() {
        assert!(parse_url("http://127.0.0.1:9/x").is_ok());
        assert!(parse_url("https://idp.example/certs").is_ok());
        assert!(parse_url("ftp://x/y").is_err());
        assert!(parse_url("/relative").is_err());
        assert!(parse_url("not a url").is_err());
    }
}
