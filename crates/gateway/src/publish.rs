//! The publish sequence, one for every caller (the HTTP API's single and batch publishes, a
//! connection's `publish` command over WebSocket, SSE or long-poll): the channel's name, the
//! publisher's permission and rate, the write-back of a `write_source` namespace, the publish
//! hook, the checks of the data ([`Node::check_publication`]), the broker.
//!
//! What differs between callers is who publishes and how their permission and rate are
//! counted; a [`Publisher`] says that, and nothing else.

use std::sync::Arc;

use serde_json::value::RawValue;
use switchboard_broker::Position;

use crate::auth::Identity;
use crate::node::{ApiError, Node, Target};

/// Who publishes, as the sequence asks it.
pub(crate) trait Publisher {
    /// The publisher: the author of a write, the owner of an idempotency key.
    fn identity(&self) -> &Identity;

    /// Whether it may publish to `target` now: its permission, then its rate.
    fn permit(&mut self, target: Target<'_>) -> Result<(), ApiError>;

    /// [`Publisher::permit`] for the items of a batch at once (a rate may be taken once for
    /// all of them); one verdict per item, in order.
    fn permit_batch<'a>(&mut self, targets: Vec<Result<Target<'a>, ApiError>>) -> Vec<Result<Target<'a>, ApiError>> {
        targets.into_iter().map(|t| t.and_then(|t| self.permit(t).map(|()| t))).collect()
    }

    /// The data to publish after the application's publish hook, when the channel's
    /// namespace has one for this kind of publisher.
    async fn hook(&self, _channel: &str, data: Box<RawValue>) -> Result<Box<RawValue>, ApiError> {
        Ok(data)
    }
}

/// What a publish came to.
pub enum Outcome {
    /// Published at this position.
    Published(Position),
    /// Written to the device of a `write_source` namespace: the source's answer.
    Written(serde_json::Value),
}

/// The answer's body: `{"offset", "epoch"}`, or the source's answer.
impl serde::Serialize for Outcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Published<'a> {
            offset: u64,
            epoch: &'a str,
        }
        match self {
            Outcome::Published(pos) => Published { offset: pos.offset, epoch: &pos.epoch }.serialize(s),
            Outcome::Written(reply) => reply.serialize(s),
        }
    }
}

/// A publication asked for: channel, data and idempotency key.
pub struct Asked {
    pub channel: String,
    pub data: Box<RawValue>,
    pub idempotency_key: Option<String>,
    pub tags: Option<switchboard_protocol::filter::Tags>,
}

/// Publishes one publication on behalf of `by`.
pub async fn one(node: &Node, by: &mut impl Publisher, asked: Asked) -> Result<Outcome, ApiError> {
    let permitted = node.target(&asked.channel).and_then(|t| by.permit(t).map(|()| t));
    if let Some(source) = crate::sources::write_source(node, &asked.channel) {
        return write(node, by, source, &asked.channel, asked.data, permitted).await;
    }
    let target = permitted?;
    let data = by.hook(&asked.channel, asked.data).await?;
    let key = asked.idempotency_key.as_deref().map(|k| (k, by.identity()));
    let checked = node.check_publication(target, Arc::new(data), key, asked.tags)?;
    node.publish(checked).await.map(Outcome::Published)
}

/// Publishes a batch on behalf of `by`: items of a `write_source` namespace are writes, one
/// after the other; the rest are permitted together and go to the broker as one batch. One
/// result per item, in order.
pub async fn batch(node: &Node, by: &mut impl Publisher, items: Vec<Asked>) -> Vec<Result<Outcome, ApiError>> {
    let mut results: Vec<Option<Result<Outcome, ApiError>>> = Vec::with_capacity(items.len());
    let (mut at, mut channels, mut rest) = (Vec::new(), Vec::new(), Vec::new());
    for (i, asked) in items.into_iter().enumerate() {
        match crate::sources::write_source(node, &asked.channel) {
            Some(source) => {
                let permitted = node.target(&asked.channel).and_then(|t| by.permit(t).map(|()| t));
                results.push(Some(write(node, by, source, &asked.channel, asked.data, permitted).await));
            }
            None => {
                results.push(None);
                at.push(i);
                channels.push(asked.channel);
                rest.push((asked.data, asked.idempotency_key, asked.tags));
            }
        }
    }
    let verdicts = by.permit_batch(channels.iter().map(|ch| node.target(ch)).collect());
    let mut checked = Vec::with_capacity(rest.len());
    for ((verdict, channel), (data, key, tags)) in verdicts.into_iter().zip(&channels).zip(rest) {
        let item = match verdict {
            Ok(target) => match by.hook(channel, data).await {
                Ok(data) => {
                    node.check_publication(target, Arc::new(data), key.as_deref().map(|k| (k, by.identity())), tags)
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        checked.push(item);
    }
    for (i, published) in at.into_iter().zip(node.publish_batch(checked).await) {
        results[i] = Some(published.map(Outcome::Published));
    }
    results.into_iter().map(|r| r.unwrap_or_else(|| Err(ApiError::new(500, "batch item without a result")))).collect()
}

/// A write to `source`, the device side of a `write_source` namespace; audited whatever the
/// checks said.
async fn write(
    node: &Node,
    by: &impl Publisher,
    source: &str,
    channel: &str,
    data: Box<RawValue>,
    permitted: Result<Target<'_>, ApiError>,
) -> Result<Outcome, ApiError> {
    crate::sources::write(node, by.identity(), source, channel, Arc::new(data), permitted).await.map(Outcome::Written)
}
