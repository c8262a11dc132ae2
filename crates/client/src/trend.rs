//! Trends (docs/protocol.md, "Trends"): a point channel's downsampled values, read over the HTTP
//! API ([`HttpApi::trend`], `GET /api/channels/{ch}/trend`) or carried by a subscribe result
//! that asked for one ([`Subscribed::trend_reply`]); both answer a [`Trend`].

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::http::HttpApi;
use crate::reply::Subscribed;

/// What a path segment keeps as is (RFC 3986 unreserved); a channel's `:` and `/` are encoded.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// A trend: `{"step_s", "buckets", "tiers"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trend {
    /// The step of the buckets: the one asked for rounded up to a multiple of the stored step
    /// of the tier read (the finest that reaches back to the window's start).
    pub step_s: u64,
    /// Oldest first, only buckets that saw a value.
    pub buckets: Vec<TrendBucket>,
    /// The tiers the channel's namespace keeps, finest first: how far back a read reaches, and
    /// at which step. Empty from a node that does not name them.
    #[serde(default)]
    pub tiers: Vec<TrendTier>,
}

/// One bucket: the numeric values published in `[t, t + step_s)` (`t`: unix ms).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TrendBucket {
    pub t: u64,
    pub min: f64,
    pub max: f64,
    pub last: f64,
    pub n: u64,
}

/// One tier a namespace keeps: buckets of `step_s` seconds reaching back `window_s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrendTier {
    pub step_s: u64,
    pub window_s: u64,
}

impl HttpApi {
    /// `GET /api/channels/{channel}/trend`: the trend over the `window_s` seconds before
    /// `until_ms` (unix ms; now when `None`, a zoom into history otherwise) in buckets of
    /// `step_s` (the stored step when `None`).
    pub async fn trend(
        &self,
        channel: &str,
        window_s: u64,
        step_s: Option<u64>,
        until_ms: Option<u64>,
    ) -> Result<Trend> {
        let v = self.get(&trend_path(channel, window_s, step_s, until_ms)).await?;
        serde_json::from_value(v).map_err(|e| Error::Decode(format!("trend reply: {e}")))
    }
}

fn trend_path(channel: &str, window_s: u64, step_s: Option<u64>, until_ms: Option<u64>) -> String {
    let mut path = format!("/api/channels/{}/trend?window_s={window_s}", utf8_percent_encode(channel, SEGMENT));
    if let Some(step) = step_s {
        path.push_str(&format!("&step_s={step}"));
    }
    if let Some(until) = until_ms {
        path.push_str(&format!("&until_ms={until}"));
    }
    path
}

impl Subscribed {
    /// The channel's trend up to the subscription's position, when the subscribe asked for
    /// one (`trend` option); `Err` when the node sent one this client cannot read.
    pub fn trend_reply(&self) -> Option<Result<Trend>> {
        self.trend.as_ref().map(|t| {
            serde_json::from_value(t.clone()).map_err(|e| Error::Decode(format!("subscribe result's trend: {e}")))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio::net::TcpListener;

    fn reply() -> serde_json::Value {
        json!({"step_s": 10, "buckets": [{"t": 1_000_000, "min": 1.0, "max": 2.5, "last": 2.0, "n": 3}],
               "tiers": [{"step_s": 1, "window_s": 3600}, {"step_s": 10, "window_s": 86400}]})
    }

    #[tokio::test]
    async fn trend_read_asks_until_ms_and_names_the_tiers() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut conn = BufReader::new(tcp);
            let mut lines = Vec::new();
            for _ in 0..2 {
                let mut request = String::new();
                loop {
                    let mut line = String::new();
                    conn.read_line(&mut line).await.unwrap();
                    if line == "\r\n" {
                        break;
                    }
                    request.push_str(&line);
                }
                lines.push(request.lines().next().unwrap().to_string());
                let body = reply().to_string();
                let resp = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
                conn.get_mut().write_all(resp.as_bytes()).await.unwrap();
            }
            lines
        });
        let api = HttpApi::new(&format!("http://{addr}")).unwrap();
        let past = api.trend("pt:plant/a", 600, Some(10), Some(1_000_500)).await.unwrap();
        let now = api.trend("pt:plant/a", 60, None, None).await.unwrap();
        assert_eq!(
            server.await.unwrap(),
            [
                "GET /api/channels/pt%3Aplant%2Fa/trend?window_s=600&step_s=10&until_ms=1000500 HTTP/1.1",
                "GET /api/channels/pt%3Aplant%2Fa/trend?window_s=60 HTTP/1.1",
            ]
        );
        assert_eq!(past.step_s, 10);
        assert_eq!(past.buckets, [TrendBucket { t: 1_000_000, min: 1.0, max: 2.5, last: 2.0, n: 3 }]);
        assert_eq!(past.tiers, [TrendTier { step_s: 1, window_s: 3600 }, TrendTier { step_s: 10, window_s: 86400 }]);
        assert_eq!(now, past);
    }

    #[test]
    fn trend_of_a_subscribe_result_reads_the_same_and_tiers_may_be_absent() {
        let s: Subscribed = serde_json::from_value(json!({"epoch": "e", "offset": 4, "trend": reply()})).unwrap();
        let t = s.trend_reply().unwrap().unwrap();
        assert_eq!((t.step_s, t.buckets.len(), t.tiers.len()), (10, 1, 2));
        let bare: Subscribed = serde_json::from_value(json!({"epoch": "e", "offset": 4})).unwrap();
        assert!(bare.trend_reply().is_none());
        let old: Trend = serde_json::from_value(json!({"step_s": 1, "buckets": []})).unwrap();
        assert!(old.tiers.is_empty());
        let bad: Subscribed =
            serde_json::from_value(json!({"epoch": "e", "offset": 4, "trend": {"buckets": 1}})).unwrap();
        assert!(matches!(bad.trend_reply(), Some(Err(Error::Decode(_)))));
    }
}
