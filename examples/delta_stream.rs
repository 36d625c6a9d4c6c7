//! Streams the deterministic rate source into a Delta table until the
//! checkpoint holds `--total-batches` batches (counting earlier runs), so a
//! run that is killed and restarted ends at the same batch.
//!
//! ```text
//! cargo run -p weir-examples --bin delta-stream -- --table lake/payments \
//!     --checkpoint chk/payments --rows-per-batch 1000 --total-batches 100
//! ```

#[path = "stream_options.rs"]
mod stream_options;

use weir_delta::DeltaSink;

const USAGE: &str = "usage: delta-stream --table DIR --checkpoint DIR [--query-name N] [--rows-per-batch R] [--total-batches B] [--partition-by COL]";

#[tokio::main]
async fn main() {
    stream_options::main_with("delta-stream", &["--table", "--checkpoint"], USAGE, |o| async move {
        let sink = DeltaSink::try_new(&o.table)?.with_partition_by(o.partition_by.clone());
        stream_options::run(o, sink).await
    })
    .await;
}
