//! How a session's replies are written: the subscribe reply with every channel's result in
//! request order, and publications as `{ch, off, data}`.

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::value::RawValue;
use switchboard_broker::Publication;
use switchboard_protocol::code;
use switchboard_protocol::message::{Data, ErrorBody, Pub};

use super::Outcome;

pub(super) fn failed_code(failed: &[&(String, Outcome)]) -> u16 {
    match failed.first() {
        Some((_, Outcome::Err(e))) => e.code,
        _ => code::BAD_REQUEST,
    }
}

pub(super) fn pub_of<'a>(ch: &'a str, p: &'a Publication) -> Pub<'a> {
    let data: &RawValue = &p.data;
    Pub { ch, off: p.offset, data: Data(data) }
}

/// Serializes `{"channels": {name: result, ...}}` in request order.
pub(super) struct SubscribeReply<'a>(pub(super) &'a [(String, Outcome)]);

impl Serialize for SubscribeReply<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct OkBody<'a> {
            epoch: &'a str,
            offset: u64,
            last: Option<Pub<'a>>,
            recovered: Vec<Pub<'a>>,
            complete: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            trend: Option<&'a crate::trend::TrendReply>,
        }
        #[derive(Serialize)]
        struct ErrBody<'a> {
            error: &'a ErrorBody,
        }
        struct Channels<'a>(&'a [(String, Outcome)]);
        impl Serialize for Channels<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(self.0.len()))?;
                for (name, outcome) in self.0 {
                    match outcome {
                        Outcome::Ok { position, last, recovered, complete, trend } => m.serialize_entry(
                            name,
                            &OkBody {
                                epoch: &position.epoch,
                                offset: position.offset,
                                last: last.as_ref().map(|p| pub_of(name, p)),
                                recovered: recovered.iter().map(|p| pub_of(name, p)).collect(),
                                complete: *complete,
                                trend: trend.as_ref(),
                            },
                        )?,
                        Outcome::Err(e) => m.serialize_entry(name, &ErrBody { error: e })?,
                    }
                }
                m.end()
            }
        }
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry("channels", &Channels(self.0))?;
        m.end()
    }
}
