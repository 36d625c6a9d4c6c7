//! The README's `to_table` example, as an application would write it: a
//! stream of payments into `lake.bronze.payments` on the embedded default
//! lake (`./weir-lake` under the working directory), three micro-batches of
//! 1,000 rows, then the table's location on standard output for a reader.

use std::time::Duration;

use weir::prelude::*;

#[tokio::main]
async fn main() -> Result<()> {
    let events = read_stream(RateSource::rows_per_batch(1_000));
    let q = events
        .write_stream()
        .checkpoint_location("chk/payments-bronze")
        .trigger(Trigger::processing_time(Duration::from_millis(10)))
        .stop_after_batch(BatchId(2))
        .to_table("lake.bronze.payments")
        .await?;
    q.await_termination().await?;
    let lake = std::env::current_dir().expect("a working directory");
    println!("{}", lake.join("weir-lake/warehouse/bronze/payments").display());
    Ok(())
}
