//! Scripted WebSocket servers for the workers' unit tests.

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::Message;

/// Serves every connection with `reply`: for each incoming data frame, the frames to send
/// back. Echoes the offered subprotocol. Returns the `ws://` URL.
pub async fn serve<F>(reply: F) -> String
where
    F: Fn(&Message) -> Vec<Message> + Send + Sync + Clone + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let reply = reply.clone();
            tokio::spawn(async move {
                #[allow(clippy::result_large_err)] // tungstenite's callback signature
                let cb = |req: &Request, mut resp: Response| {
                    if let Some(p) = req.headers().get("sec-websocket-protocol") {
                        resp.headers_mut().insert("sec-websocket-protocol", p.clone());
                    }
                    Ok(resp)
                };
                let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(tcp, cb).await else { return };
                while let Some(Ok(msg)) = ws.next().await {
                    if !(msg.is_text() || msg.is_binary()) {
                        continue;
                    }
                    for r in reply(&msg) {
                        if ws.send(r).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    format!("ws://{addr}/ws")
}

/// Runs `f` on a current-thread runtime inside a `LocalSet`, as a worker process does.
pub fn local<F: std::future::Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    tokio::task::LocalSet::new().block_on(&rt, f)
}
