//! The Kafka source and sink with their connections to the broker cut at
//! random. The broker's `PROXIED` listener advertises the port of a test
//! proxy, so every connection a client makes (the bootstrap's, the
//! partition leaders', the transaction and group coordinators') goes
//! through the proxy, which cuts them mid-request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir_core::prelude::*;
use weir_kafka::{Guarantee, KafkaSink, KafkaSource, StartingOffsets};
use weir_test_support::assert_exactly_once;
use weir_test_support::proxy::TcpProxy;

use crate::broker;

/// A query from one topic to another, exactly once for `read_committed`
/// consumers, over connections cut every ~300 ms at random: restarted
/// after each stop (every stop must be retryable), every id lands once.
/// (With librdkafka's own reconnect backoff, up to ten seconds, batches
/// here took up to 15 s; with weir's default of one second, up to 3 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_connections_to_the_broker_lose_and_repeat_nothing() {
    let Some(kafka) = broker::bootstrap() else { return };
    let (Some(listen), Some(listener)) = (
        weir_test_support::service("WEIR_TEST_KAFKA_PROXY"),
        weir_test_support::service("WEIR_TEST_KAFKA_PROXIED"),
    ) else {
        return;
    };
    let mut proxy = TcpProxy::start_on(listen.parse().unwrap(), listener.parse().unwrap())
        .await
        .expect("the proxy takes the port the broker advertises");
    let via = proxy.addr().to_string();

    // 4 partitions of 1,000 records each, produced straight to the broker.
    let input = broker::topic(&kafka, "cut-in", 4);
    let producer = broker::producer(&kafka, &[]);
    for p in 0..4 {
        broker::produce(&producer, &input, p, (p as i64 * 1000)..(p as i64 * 1000 + 1000));
    }
    let output = broker::topic(&kafka, "cut-out", 2);
    let markers = format!("markers-{}", uuid::Uuid::new_v4().simple());
    let name = format!("cut-{}", uuid::Uuid::new_v4().simple());
    let chk = tempfile::tempdir().unwrap();
    let slowest = Arc::new(AtomicU64::new(0));
    let run = || async {
        let source = KafkaSource::subscribe(&via, [input.as_str()])
            .starting_offsets(StartingOffsets::Earliest)
            .max_offsets_per_trigger(100);
        let sink = KafkaSink::new(&via).topic(&output).guarantee(Guarantee::ExactlyOnce {
            marker_topic: markers.clone(),
        });
        let slowest = slowest.clone();
        let query = read_stream(source)
            // The record's key and value; the input's topic column would
            // otherwise name where each record goes.
            .map_batches(|b| Ok(b.project(&[0, 1])?))
            .write_stream()
            .query_name(&name)
            .checkpoint_location(chk.path())
            .trigger(Trigger::available_now())
            .on_progress(move |p| {
                slowest.fetch_max(p.durations_ms.total as u64, Ordering::Relaxed);
            })
            .start(sink)
            .await?;
        query.await_termination().await
    };

    let started = std::time::Instant::now();
    proxy.cut_at_random(Duration::from_millis(300), 17);
    let mut stops = 0;
    while let Err(e) = run().await {
        assert!(e.retryable(), "a cut connection stopped the query for good: {e}");
        stops += 1;
        assert!(stops < 200, "no progress: {e}");
    }
    proxy.calm();
    eprintln!(
        "{stops} stops in {:?}, the slowest batch {} ms; {} connections to the broker of {} cut open",
        started.elapsed(),
        slowest.load(Ordering::Relaxed),
        proxy.severed(),
        proxy.connections()
    );
    assert!(proxy.severed() >= 3, "too few connections cut to tell");
    // Once more, calm: nothing left, nothing repeated.
    run().await.expect("a calm run");

    let ids: Vec<i64> = broker::read_all(&kafka, &output, "read_committed")
        .iter()
        .map(|r| {
            let value: serde_json::Value = serde_json::from_str(&r.value).expect("a JSON value");
            value["id"].as_i64().expect("an id")
        })
        .collect();
    assert_exactly_once(&ids, 0..4000);
}
