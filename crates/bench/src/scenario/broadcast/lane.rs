//! A lane of a broadcast run: one channel's subscribers (the run's, or `--reference`'s) and
//! what they ask for.

use switchboard_client::Compression;

use crate::accounting::Tally;
use crate::transport::Transport;

/// One channel's subscribers: the run's, or the reference's.
pub(super) struct Lane {
    pub channel: String,
    pub transport: Transport,
    pub compression: Compression,
    pub delta: bool,
}

impl Lane {
    /// "over ws with deflate and deltas", for the progress line.
    pub fn describe(&self) -> String {
        let mut s = format!("over {}", self.transport.name());
        if self.compression == Compression::Deflate {
            s.push_str(" with deflate");
        }
        if self.delta {
            s.push_str(if self.compression == Compression::Deflate { " and deltas" } else { " with deltas" });
        }
        s
    }

    /// The bytes the lane's sockets read per delivery, where its transport counts them.
    pub fn bytes_per_delivery(&self, t: &Tally) -> Option<f64> {
        t.wire_bytes_per_delivery().filter(|_| self.transport == Transport::Ws)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_lane_says_what_its_subscribers_ask_for_and_counts_bytes_on_websockets_only() {
        let lane = |transport, compression, delta| Lane { channel: "c".into(), transport, compression, delta };
        assert_eq!(lane(Transport::Ws, Compression::Off, false).describe(), "over ws");
        assert_eq!(lane(Transport::Ws, Compression::Deflate, true).describe(), "over ws with deflate and deltas");
        assert_eq!(lane(Transport::Ws, Compression::Off, true).describe(), "over ws with deltas");
        let t = Tally { received: 4, wire_bytes: 1000, ..Default::default() };
        assert_eq!(lane(Transport::Ws, Compression::Off, false).bytes_per_delivery(&t), Some(250.0));
        assert_eq!(lane(Transport::Sse, Compression::Off, false).bytes_per_delivery(&t), None);
        assert_eq!(lane(Transport::Ws, Compression::Off, false).bytes_per_delivery(&Tally::default()), None);
    }
}
