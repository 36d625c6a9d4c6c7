//! Streams the deterministic rate source into an Iceberg table of a SQL
//! catalog until the checkpoint holds `--total-batches` batches (counting
//! earlier runs), so a run that is killed and restarted ends at the same
//! batch.
//!
//! ```text
//! cargo run -p weir-examples --bin iceberg-stream -- --catalog sqlite://lake/catalog.db \
//!     --warehouse lake/warehouse --table bronze.payments --checkpoint chk/payments \
//!     --rows-per-batch 1000 --total-batches 100
//! ```

#[path = "stream_options.rs"]
mod stream_options;

use std::sync::Arc;

use weir_catalog::SqlCatalog;
use weir_iceberg::IcebergSink;

const USAGE: &str = "usage: iceberg-stream --catalog URI --warehouse DIR --table NAMESPACE.TABLE --checkpoint DIR [--query-name N] [--rows-per-batch R] [--total-batches B] [--partition-by FIELD]";

#[tokio::main]
async fn main() {
    let required = ["--catalog", "--warehouse", "--table", "--checkpoint"];
    stream_options::main_with("iceberg-stream", &required, USAGE, |o| async move {
        let catalog = SqlCatalog::connect("lake", &o.catalog, &o.warehouse).await?;
        let sink = IcebergSink::try_new(Arc::new(catalog), &o.table)?.with_partition_by(o.partition_by.clone());
        stream_options::run(o, sink).await
    })
    .await;
}
