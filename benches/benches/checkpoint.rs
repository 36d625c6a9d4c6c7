//! The checkpoint on S3 against the checkpoint on a local disk, the table on
//! S3 in both: per-batch latency of the same query (the rate source, 1,000
//! rows a batch, into a Delta table), each side timed in the same run,
//! rounds alternating, medians reported. Target: the S3 checkpoint's median
//! batch at most 1.5 times the local one's.
//!
//! ```text
//! cargo bench -p weir-benches --bench checkpoint
//! WEIR_BENCH_BATCHES=300 WEIR_BENCH_ROUNDS=5 cargo bench -p weir-benches --bench checkpoint
//! ```
//!
//! It uses the S3 `WEIR_TEST_S3_ENDPOINT` names, or starts SeaweedFS with
//! `scripts/services/seaweedfs.sh`. The process exits 1 when the target is
//! missed.

use std::sync::{Arc, Mutex};

use weir_benches::median;
use weir_benches::s3::S3Service;
use weir_core::prelude::*;
use weir_delta::DeltaSink;

/// The phases of each batch after the first few (a run's warm-up).
#[derive(Default)]
struct Phases {
    total: Vec<f64>,
    plan: Vec<f64>,
    record: Vec<f64>,
    commit: Vec<f64>,
}

async fn run(s3: &S3Service, checkpoint_on_s3: bool, batches: u64) -> Phases {
    let table = s3.url(&format!("bench-checkpoint/{}/table", uuid::Uuid::new_v4()));
    let local = tempfile::tempdir().expect("tempdir");
    let sink = DeltaSink::try_new(&table)
        .expect("sink")
        .with_storage_option("AWS_ENDPOINT_URL", s3.endpoint.clone())
        .with_storage_option("AWS_ALLOW_HTTP", "true");
    let phases = Arc::new(Mutex::new(Phases::default()));
    let seen = phases.clone();
    let writer = read_stream(RateSource::rows_per_batch(1_000))
        .write_stream()
        .query_name("bench")
        .stop_after_batch(BatchId(batches - 1))
        .on_progress(move |p| {
            if p.batch_id.0 >= 5 {
                let mut seen = seen.lock().unwrap();
                seen.total.push(p.durations_ms.total);
                seen.plan.push(p.durations_ms.plan);
                seen.record.push(p.durations_ms.record);
                seen.commit.push(p.durations_ms.commit);
            }
        });
    let writer = if checkpoint_on_s3 {
        writer
            .checkpoint_location(s3.url(&format!("bench-checkpoint/{}/chk/", uuid::Uuid::new_v4())))
            .checkpoint_options([("aws_endpoint", s3.endpoint.as_str()), ("aws_allow_http", "true")])
    } else {
        writer.checkpoint_location(local.path())
    };
    let q = writer.start(sink).await.expect("start");
    q.await_termination().await.expect("run");
    let mut phases = phases.lock().unwrap();
    std::mem::take(&mut *phases)
}

fn p99(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let batches: u64 = std::env::var("WEIR_BENCH_BATCHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let rounds: usize = std::env::var("WEIR_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let s3 = S3Service::start();
    println!("checkpoint on S3 against a local checkpoint, a Delta table on S3, {batches} batches of 1,000 rows, {rounds} rounds");
    let mut ratios = Vec::new();
    for round in 1..=rounds {
        let local = run(&s3, false, batches).await;
        let remote = run(&s3, true, batches).await;
        let (l, r) = (median(&local.total), median(&remote.total));
        println!(
            "round {round}: local {:.1} ms (p99 {:.1}; plan {:.1}, commit {:.1}, record {:.1}), S3 {:.1} ms (p99 {:.1}; plan {:.1}, commit {:.1}, record {:.1}): {:.2}x",
            l,
            p99(&local.total),
            median(&local.plan),
            median(&local.commit),
            median(&local.record),
            r,
            p99(&remote.total),
            median(&remote.plan),
            median(&remote.commit),
            median(&remote.record),
            r / l
        );
        ratios.push(r / l);
    }
    let ratio = median(&ratios);
    println!("median ratio {ratio:.2} (target at most 1.5)");
    if ratio > 1.5 {
        std::process::exit(1);
    }
}
