//! SASL on the test broker's second listener (user `weir`, password
//! `weir-secret`): PLAIN in every build, SCRAM with the `tls` feature
//! (OpenSSL). Secrets never show in errors or `Debug`.

use std::time::Duration;

use weir_core::prelude::*;
use weir_core::sink::MemorySink;
use weir_kafka::{KafkaSource, StartingOffsets};
use weir_test_support::assert_exactly_once;

use crate::broker::{self, ids};

async fn read_with(
    sasl: &str,
    topic: &str,
    mechanism: &str,
    password: &str,
) -> (weir_core::Result<()>, MemorySink, String) {
    let source = KafkaSource::subscribe(sasl, [topic])
        .starting_offsets(StartingOffsets::Earliest)
        .option("security.protocol", "SASL_PLAINTEXT")
        .option("sasl.mechanism", mechanism)
        .option("sasl.username", "weir")
        .option("sasl.password", password)
        .request_timeout(Duration::from_secs(5));
    let shown = format!("{source:?}");
    let sink = MemorySink::new("t");
    let chk = tempfile::tempdir().unwrap();
    let result = async {
        read_stream(source)
            .write_stream()
            .checkpoint_location(chk.path())
            .trigger(Trigger::available_now())
            .start(sink.clone())
            .await?
            .await_termination()
            .await
    };
    let result = tokio::time::timeout(Duration::from_secs(60), result)
        .await
        .expect("the query ends");
    (result, sink, shown)
}

#[tokio::test]
async fn sasl_plain_reads_and_a_wrong_password_is_refused_without_showing_it() {
    let (Some(kafka), Some(sasl)) = (broker::bootstrap(), broker::sasl_bootstrap()) else {
        return;
    };
    let topic = broker::topic(&kafka, "sasl", 2);
    broker::send(&kafka, &topic, 0, 0..10);
    broker::send(&kafka, &topic, 1, 10..20);
    let (result, sink, shown) = read_with(&sasl, &topic, "PLAIN", "weir-secret").await;
    result.unwrap();
    assert_exactly_once(&ids(&sink.batches()), 0..20);
    assert!(!shown.contains("weir-secret"), "{shown}");

    let (result, sink, shown) = read_with(&sasl, &topic, "PLAIN", "not-the-secret").await;
    let err = result.unwrap_err().to_string();
    assert!(
        !err.contains("not-the-secret") && !shown.contains("not-the-secret"),
        "{err} / {shown}"
    );
    assert!(
        err.contains("refused the client's credentials") && err.contains("Authentication failed"),
        "{err}"
    );
    assert_eq!(sink.row_count(), 0);
}

#[cfg(feature = "tls")]
#[tokio::test]
async fn sasl_scram_reads_with_the_tls_feature() {
    let (Some(kafka), Some(sasl)) = (broker::bootstrap(), broker::sasl_bootstrap()) else {
        return;
    };
    let topic = broker::topic(&kafka, "scram", 1);
    broker::send(&kafka, &topic, 0, 0..10);
    for mechanism in ["SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let (result, sink, _) = read_with(&sasl, &topic, mechanism, "weir-secret").await;
        result.unwrap();
        assert_exactly_once(&ids(&sink.batches()), 0..10);
    }
}
