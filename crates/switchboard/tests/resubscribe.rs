//! Black-box tests of the client library's subscribe-again rule (`switchboard_client::
//! resubscribe`) against real nodes: channels past a reply's byte budget (413) are subscribed
//! in further commands, and channels a dead broker shard refuses (503) or ends (`unsubscribed`)
//! wait and come back with `recover` once the shard does, on the same connection.
#![allow(clippy::unwrap_used)] // tests: a failed step should panic with its error

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::json;
use switchboard_client::{ChannelResult, Client, Event, Format, HttpApi, SubscribeOptions, Subscriber, Update};
use switchboard_testkit::Shards;

mod support;
use support::Server;

/// The next update of `sub` within `limit`, presence events left out.
async fn update(sub: &mut Subscriber, client: &mut Client, limit: Duration) -> Update {
    loop {
        match tokio::time::timeout(limit, sub.next(client)).await.expect("an update in time").unwrap() {
            Update::Event(Event::Join(_) | Event::Leave(_)) => continue,
            Update::Event(Event::Closed { code, reason }) => panic!("connection closed ({code}: {reason})"),
            u => return u,
        }
    }
}

#[tokio::test]
async fn resubscribe_413_channels_are_subscribed_in_further_commands() {
    let node = Server::start(&[]);
    let api = node.api();
    // 20 channels whose latest value is about 60 KB: one reply's budget (512 KiB) takes 8.
    let channels: Vec<String> = (0..20).map(|i| format!("big:{i}")).collect();
    for (i, ch) in channels.iter().enumerate() {
        api.publish(ch, &json!({"i": i, "pad": "x".repeat(60_000)})).await.unwrap();
    }
    let options = SubscribeOptions::new(channels.iter().cloned()).initial(true);

    // One command alone is refused past the budget ...
    let one = Client::connect(&node.ws(), Format::Json).await.unwrap();
    let reply = one.subscribe(options.clone()).await.unwrap();
    let refused = reply.errors().filter(|(_, e)| e.code == 413).count();
    assert!(refused > 0 && refused < channels.len(), "{refused} of {} refused with 413", channels.len());

    // ... and `subscribe_all` takes every channel, in further commands.
    let all = Client::connect(&node.ws(), Format::Json).await.unwrap();
    let reply = all.subscribe_all(options.clone()).await.unwrap();
    assert_eq!(reply.channels.len(), channels.len());
    for (i, ch) in channels.iter().enumerate() {
        match &reply.channels[ch] {
            ChannelResult::Subscribed(s) => assert_eq!(s.last.as_ref().unwrap().data["i"], json!(i), "{ch}"),
            ChannelResult::Error { error } => panic!("{ch}: {error:?}"),
        }
    }

    // A subscriber delivers every channel's latest value, in the order asked.
    let mut client = Client::connect(&node.ws(), Format::Json).await.unwrap();
    let mut sub = Subscriber::new(options);
    let mut got = Vec::new();
    while got.len() < channels.len() {
        match update(&mut sub, &mut client, Duration::from_secs(10)).await {
            Update::Delivery(d) => got.push(d.ch),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got, channels);
}

#[tokio::test]
async fn resubscribe_channels_of_a_dead_shard_wait_and_recover_on_the_same_connection() {
    let mut shards = Shards::start(2);
    let node = Server::start(&["--broker", &shards.urls_joined()]);
    let api = node.api();
    let channels: Vec<String> = (0..12).map(|i| format!("room:{i}")).collect();
    for ch in &channels {
        api.publish(ch, &json!({"n": 1})).await.unwrap();
    }
    let mut client = Client::connect(&node.ws(), Format::Json).await.unwrap();
    let mut sub = Subscriber::new(SubscribeOptions::new(channels.iter().cloned()));
    sub.subscribe_due(&client).await.unwrap();
    assert_eq!(sub.streams().channels().count(), channels.len());
    assert!(sub.try_next().is_none(), "nothing to deliver without `initial`");
    for ch in &channels {
        api.publish(ch, &json!({"n": 2})).await.unwrap();
    }
    // Offsets delivered per channel, with their data's `n`.
    let mut delivered: HashMap<String, Vec<(u64, u64)>> = HashMap::new();
    while delivered.values().map(Vec::len).sum::<usize>() < channels.len() {
        match update(&mut sub, &mut client, Duration::from_secs(10)).await {
            Update::Delivery(d) => delivered.entry(d.ch).or_default().push((d.off, d.data["n"].as_u64().unwrap())),
            other => panic!("{other:?}"),
        }
    }

    shards.servers_mut()[1].kill();
    let mut dead = HashSet::new();
    for ch in &channels {
        if api.publish(ch, &json!({"n": 3})).await.is_err() {
            dead.insert(ch.clone());
        }
    }
    assert!(!dead.is_empty() && dead.len() < channels.len(), "the channels hash to both shards");

    // Each dead channel is ended by the node (`unsubscribed`) and refused for now (503) when
    // the subscriber asks it again; the live ones stream on.
    let mut waits: HashMap<String, usize> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while dead.iter().any(|ch| waits.get(ch).copied().unwrap_or(0) < 2)
        || delivered.values().map(Vec::len).sum::<usize>() < 2 * channels.len() - dead.len()
    {
        assert!(Instant::now() < deadline, "waits {waits:?}, delivered {delivered:?}");
        match update(&mut sub, &mut client, Duration::from_secs(20)).await {
            Update::Waiting { ch, .. } => *waits.entry(ch).or_default() += 1,
            Update::Delivery(d) => delivered.entry(d.ch).or_default().push((d.off, d.data["n"].as_u64().unwrap())),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(waits.keys().cloned().collect::<HashSet<_>>(), dead, "only the dead shard's channels wait");
    assert!(sub.waiting().iter().all(|ch| dead.contains(ch)));

    // The shard comes back (without its data): the waiting channels are subscribed again on
    // the same connection, report the gap of the lost epoch, and stream.
    shards.servers_mut()[1].restart();
    let base = node.base();
    let waiting: Vec<String> = dead.iter().cloned().collect();
    let publisher = tokio::spawn(async move {
        let api = HttpApi::new(&base).unwrap();
        for _ in 0..120 {
            for ch in &waiting {
                let _ = api.publish(ch, &json!({"n": 4})).await;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    let mut gaps = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(40);
    while dead.iter().any(|ch| !gaps.contains(ch) || !delivered[ch].iter().any(|&(_, n)| n == 4)) {
        assert!(Instant::now() < deadline, "gaps {gaps:?}, delivered {delivered:?}");
        match update(&mut sub, &mut client, Duration::from_secs(20)).await {
            Update::Gap { gap, .. } => {
                assert!(gap.epoch_changed(), "{gap}");
                assert!(!delivered[&gap.ch].iter().any(|&(_, n)| n == 4), "the gap comes before what follows it");
                gaps.insert(gap.ch);
            }
            Update::Delivery(d) => delivered.entry(d.ch).or_default().push((d.off, d.data["n"].as_u64().unwrap())),
            Update::Waiting { ch, .. } => assert!(dead.contains(&ch), "{ch}"),
            other => panic!("{other:?}"),
        }
    }
    publisher.abort();
    assert!(sub.waiting().is_empty());
    for ch in &channels {
        let got = &delivered[ch];
        let ns: Vec<u64> = got.iter().map(|&(_, n)| n).collect();
        if dead.contains(ch) {
            assert_eq!(&ns[..1], [2], "{ch}: {got:?}");
            assert!(ns[1..].iter().all(|&n| n == 4), "{ch}: {got:?}");
            let new_epoch: Vec<u64> = got[1..].iter().map(|&(off, _)| off).collect();
            assert!(new_epoch.windows(2).all(|w| w[0] < w[1]), "{ch}: once and in order: {got:?}");
        } else {
            assert_eq!(ns, [2, 3], "{ch}: each publication once");
        }
    }
}
