//! How a stream's messages become events: [`StreamEvents`], the outbox [`Framer`] of a
//! `GET /sse?channels=` stream, whichever side writes them (the stream's own socket, or hyper's
//! response body).
//!
//! A publication is a default event whose `id:` is the stream's position after it; the reply
//! to the stream's subscribe becomes `subscribed`, followed by the recovered and initial
//! publications; other messages are named events (`join`, `leave`, `disconnect`, `reply`).

use std::collections::HashMap;
use std::io::Write;

use indexmap::IndexMap;
use switchboard_protocol::message::encode_publication;
use switchboard_protocol::Format;

use switchboard_broker::Publication;

use super::{ChannelPos, FULL_ID_CHANNELS, RETRY};
use crate::message::pub_of;
use crate::message::{Kind, Message, Outcome, Outcomes};
use crate::outbox::Framer;

/// Appends one event. `data` is one JSON message; the server's JSON has no raw line breaks,
/// but a text with some is still split into `data:` lines (readers join them with `\n`).
pub fn write_event(out: &mut Vec<u8>, event: Option<&str>, id: Option<&[u8]>, data: &[u8]) {
    // Room for the whole event at once (one line of data, as the server's is): an event
    // written alone fills its buffer exactly, which then becomes shared bytes as it is.
    let event_len = event.map_or(0, |e| e.len() + 8);
    let id_len = id.map_or(0, |i| i.len() + 5);
    out.reserve(event_len + id_len + data.len() + 8);
    if let Some(e) = event {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(e.as_bytes());
        out.push(b'\n');
    }
    if let Some(id) = id {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(id);
        out.push(b'\n');
    }
    for line in data.split(|b| *b == b'\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.strip_suffix(b"\r").unwrap_or(line));
        out.push(b'\n');
    }
    out.push(b'\n');
}

/// The SSE event name of a message of `kind` (`None`: the default `message`, a publication).
pub fn event_name(kind: &Kind) -> Option<&'static str> {
    match kind {
        Kind::Pub { .. } => None,
        Kind::Disconnect { .. } => Some("disconnect"),
        Kind::Reply { .. } => Some("reply"),
        Kind::Join => Some("join"),
        Kind::Leave => Some("leave"),
        // Server-side subscriptions of the connect hook.
        Kind::Subscribed(_) => Some("subscribed"),
        Kind::Unsubscribed | Kind::Other => Some("message"),
    }
}

/// The positions of a stream's channels, in subscription order, and the event ids they make.
#[derive(Default)]
pub(super) struct Positions {
    pub map: IndexMap<String, ChannelPos>,
    /// Subscribed channels: beyond [`FULL_ID_CHANNELS`] ids name one channel.
    pub channels: usize,
}

impl Positions {
    /// Writes the event id after a publication of `own` (`None`: the `subscribed` event) into
    /// `id`; false when the event carries none.
    pub fn write_id(&self, id: &mut Vec<u8>, own: Option<&str>) -> bool {
        id.clear();
        let mut one = |ch: &str, p: &ChannelPos| {
            if !id.is_empty() {
                id.push(b';');
            }
            let _ = write!(id, "{ch}@{}:{}", p.epoch, p.offset);
        };
        if self.channels > FULL_ID_CHANNELS {
            match own.and_then(|ch| self.map.get_key_value(ch)) {
                Some((ch, p)) => one(ch, p),
                None => return false,
            }
        } else {
            for (ch, p) in &self.map {
                one(ch, p);
            }
        }
        !id.is_empty()
    }

    #[cfg(test)]
    pub fn id(&self, own: Option<&str>) -> Option<String> {
        let mut id = Vec::new();
        self.write_id(&mut id, own).then(|| String::from_utf8(id).unwrap_or_default())
    }
}

/// The [`Framer`] of one `GET /sse?channels=` stream. See the module docs.
pub(crate) struct StreamEvents {
    /// Requested channels, in order.
    pub channels: Vec<String>,
    pub initial: bool,
    /// Positions the client asked to resume from (`Last-Event-ID`).
    pub recover: HashMap<String, ChannelPos>,
    /// The id of the stream's subscribe command, whose reply becomes `subscribed`.
    pub subscribe_id: u32,
    positions: Positions,
    started: bool,
    /// The last event id, reused between events.
    id: Vec<u8>,
}

impl StreamEvents {
    pub fn new(channels: Vec<String>, initial: bool, recover: HashMap<String, ChannelPos>, subscribe_id: u32) -> Self {
        StreamEvents {
            channels,
            initial,
            recover,
            subscribe_id,
            positions: Positions::default(),
            started: false,
            id: Vec::new(),
        }
    }

    /// Turns the reply of the stream's subscribe (what each channel came to) into
    /// `subscribed`, then the recovered and initial publications.
    fn subscribed(&mut self, out: &mut Vec<u8>, outcomes: &Outcomes) {
        let mut summary = serde_json::Map::new();
        let mut plan: Vec<(&str, &Outcome)> = Vec::new();
        let by_name: HashMap<&str, &Outcome> = outcomes.iter().collect();
        for ch in &self.channels {
            let Some(r) = by_name.get(ch.as_str()).copied() else { continue };
            let entry = match r {
                Outcome::Err(e) => serde_json::json!({ "error": e }),
                Outcome::Ok { position, last, complete, .. } => {
                    let (epoch, offset) = (&*position.epoch, position.offset);
                    // Where a reconnect must resume if the stream breaks before this channel's
                    // recovered and initial publications got through.
                    let before = match self.recover.get(ch) {
                        Some(p) => p.clone(),
                        None if self.initial && last.is_some() => {
                            ChannelPos { epoch: epoch.to_string(), offset: offset.saturating_sub(1) }
                        }
                        None => ChannelPos { epoch: epoch.to_string(), offset },
                    };
                    self.positions.map.insert(ch.clone(), before);
                    plan.push((ch, r));
                    serde_json::json!({ "epoch": epoch, "offset": offset, "complete": complete })
                }
            };
            summary.insert(ch.clone(), entry);
        }
        self.positions.channels = self.channels.len().max(1);
        let body = serde_json::json!({ "subscribed": { "channels": summary } });
        let has_id = self.positions.write_id(&mut self.id, None);
        write_event(out, Some("subscribed"), has_id.then_some(&self.id[..]), body.to_string().as_bytes());
        for (ch, r) in plan {
            let Outcome::Ok { position, last, recovered, complete, .. } = r else { continue };
            let (epoch, offset) = (&*position.epoch, position.offset);
            let from = self.recover.get(ch).filter(|p| p.epoch == epoch).map(|p| p.offset);
            let mut at = from.unwrap_or(0);
            let id = &mut self.id;
            let mut emit = |out: &mut Vec<u8>, positions: &mut Positions, p: &Publication| {
                // The epoch too: a recovery from another epoch delivers the current one's.
                if let Some(pos) = positions.map.get_mut(ch) {
                    *pos = ChannelPos { epoch: epoch.to_string(), offset: p.offset };
                }
                let has_id = positions.write_id(id, Some(ch));
                let text = encode_publication(Format::Json, pub_of(ch, p));
                write_event(out, None, has_id.then_some(&id[..]), &text);
            };
            if self.recover.contains_key(ch) {
                let start = at;
                for p in recovered.iter().filter(|p| p.offset > start) {
                    emit(out, &mut self.positions, p);
                    at = p.offset;
                }
                // The history did not reach back (or the epoch changed): the latest value is
                // what can still be given, unless the recovered publications hold it.
                if !complete {
                    if let Some(l) = last.as_ref().filter(|l| l.offset > at) {
                        emit(out, &mut self.positions, l);
                    }
                }
            } else if self.initial {
                if let Some(l) = last {
                    emit(out, &mut self.positions, l);
                }
            }
            if let Some(pos) = self.positions.map.get_mut(ch) {
                *pos = ChannelPos { epoch: epoch.to_string(), offset };
            }
        }
    }
}

impl Framer for StreamEvents {
    fn frame(&mut self, out: &mut Vec<u8>, m: &Message) {
        if !self.started {
            self.started = true;
            out.extend_from_slice(RETRY);
        }
        match &m.kind {
            Kind::Pub { ch, off } => {
                if let Some(p) = self.positions.map.get_mut(&**ch) {
                    p.offset = *off;
                }
                let has_id = self.positions.write_id(&mut self.id, Some(ch));
                write_event(out, None, has_id.then_some(&self.id[..]), &m.text);
            }
            Kind::Reply { id, outcomes: Some(outcomes), .. }
                if *id == self.subscribe_id && self.positions.channels == 0 =>
            {
                self.subscribed(out, outcomes)
            }
            _ => write_event(out, event_name(&m.kind), None, &m.text),
        }
    }
}
