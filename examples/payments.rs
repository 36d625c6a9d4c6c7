//! Three sinks from one stream of payments, each exactly once, on the
//! embedded default lake (`./weir-lake`, or `--lake DIR` / `WEIR_LAKE`):
//!
//! - `lake.bronze.payments`: every payment, landed in a Delta table;
//! - `lake.risk.high_value`: payments of 900.00 or more, in an Iceberg table
//!   partitioned by day;
//! - alerts: payments of 990.00 or more, upserted by a `foreach_batch`
//!   function into a keyed store (a SQLite table keyed by event id), which
//!   records the last batch it applied in the same transaction, so a
//!   replayed batch changes nothing.
//!
//! Each query has its own checkpoint. Each run adds `--batches N` batches
//! of `--rows-per-batch R` payments to every query, then reads the three
//! sinks back and checks that each holds exactly its payments, once.
//!
//! ```text
//! cargo run --release -p weir-examples --bin payments -- --batches 5
//! ```

#[path = "delta_read.rs"]
mod delta_read;
#[path = "lake_options.rs"]
mod lake_options;
#[path = "payment_rules.rs"]
mod payment_rules;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Decimal128Type, Int64Type};
use arrow_array::RecordBatch;
use futures::TryStreamExt;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
use weir::catalog::{Catalogs, Config};
use weir::prelude::*;

use crate::delta_read::delta_event_ids;
use crate::lake_options::LakeOptions;
use crate::payment_rules::{at_least, ALERT, BRONZE, HIGH_VALUE, RISK};

/// The alerts store: alerts keyed by event id, and each query's last
/// applied batch.
async fn alerts_store(lake: &Path) -> std::result::Result<SqlitePool, BoxError> {
    let options = SqliteConnectOptions::new()
        .filename(lake.join("alerts.db"))
        .create_if_missing(true);
    let pool = SqlitePool::connect_with(options).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS alerts (event_id INTEGER PRIMARY KEY, account_id INTEGER NOT NULL, \
         amount_cents INTEGER NOT NULL, batch_id INTEGER NOT NULL)",
    )
    .execute(&pool)
    .await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS applied (query TEXT PRIMARY KEY, batch_id INTEGER NOT NULL)")
        .execute(&pool)
        .await?;
    Ok(pool)
}

/// Upserts a batch's alerts and records the batch, in one transaction; a
/// batch already applied is skipped.
async fn apply_alerts(
    pool: &SqlitePool,
    batches: Vec<RecordBatch>,
    batch: BatchId,
) -> std::result::Result<(), BoxError> {
    let mut tx = pool.begin().await?;
    let applied: Option<i64> = sqlx::query_scalar("SELECT batch_id FROM applied WHERE query = 'payments-alerts'")
        .fetch_optional(&mut *tx)
        .await?;
    if applied.is_some_and(|b| b >= batch.0 as i64) {
        return Ok(());
    }
    for b in &batches {
        let ids = b
            .column_by_name("event_id")
            .ok_or("no event_id")?
            .as_primitive::<Int64Type>();
        let accounts = b
            .column_by_name("account_id")
            .ok_or("no account_id")?
            .as_primitive::<Int64Type>();
        let amounts = b
            .column_by_name("amount")
            .ok_or("no amount")?
            .as_primitive::<Decimal128Type>();
        for i in 0..b.num_rows() {
            sqlx::query(
                "INSERT INTO alerts (event_id, account_id, amount_cents, batch_id) VALUES (?, ?, ?, ?) \
                 ON CONFLICT (event_id) DO UPDATE SET account_id = excluded.account_id, \
                 amount_cents = excluded.amount_cents, batch_id = excluded.batch_id",
            )
            .bind(ids.value(i))
            .bind(accounts.value(i))
            .bind(amounts.value(i) as i64)
            .bind(batch.0 as i64)
            .execute(&mut *tx)
            .await?;
        }
    }
    sqlx::query(
        "INSERT INTO applied (query, batch_id) VALUES ('payments-alerts', ?) \
         ON CONFLICT (query) DO UPDATE SET batch_id = excluded.batch_id",
    )
    .bind(batch.0 as i64)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// The event ids of the Iceberg table `name`, scanned with iceberg.
async fn iceberg_ids(catalogs: &Catalogs, name: &str) -> std::result::Result<Vec<i64>, BoxError> {
    let catalog = catalogs.iceberg_catalog("lake").await?;
    let ident = weir::iceberg::parse_ident(name.trim_start_matches("lake."))?;
    let loaded = catalog.load(&ident).await?.ok_or("no such table")?;
    let table = iceberg::table::Table::builder()
        .file_io(catalog.file_io().clone())
        .metadata(loaded.metadata)
        .metadata_location(loaded.metadata_location)
        .identifier(ident)
        .readonly(true)
        .runtime(iceberg::Runtime::current())
        .build()?;
    let batches: Vec<RecordBatch> = table.scan().build()?.to_arrow().await?.try_collect().await?;
    let mut ids = Vec::new();
    for b in batches {
        ids.extend(
            b.column_by_name("event_id")
                .ok_or("no event_id")?
                .as_primitive::<Int64Type>()
                .values()
                .iter(),
        );
    }
    Ok(ids)
}

/// Checks that `ids` are exactly `expected`, each once.
fn exactly(sink: &str, mut ids: Vec<i64>, expected: &[i64]) -> std::result::Result<(), BoxError> {
    ids.sort_unstable();
    let distinct: HashSet<_> = ids.iter().collect();
    println!(
        "{sink}: {} rows, {} distinct, {} expected",
        ids.len(),
        distinct.len(),
        expected.len()
    );
    if ids != expected {
        return Err(format!("{sink} does not hold exactly its payments once").into());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> std::result::Result<(), BoxError> {
    let options = LakeOptions::init("payments", 5, 10_000)?;
    let catalogs = Catalogs::new(Config::embedded(&options.lake));
    let checkpoints = options.lake.join("checkpoints");
    let rows = options.rows_per_batch;
    let payments = move || read_stream(RateSource::rows_per_batch(rows));

    let chk = checkpoints.join("payments-bronze");
    let bronze_last = options.last_batch(&chk).await?;
    let bronze = payments()
        .write_stream()
        .checkpoint_location(&chk)
        .stop_after_batch(bronze_last)
        .to_table_in(&catalogs, BRONZE, TableOptions::new())
        .await?;

    let chk = checkpoints.join("payments-risk");
    let risk_last = options.last_batch(&chk).await?;
    let risk = payments()
        .map_batches(|b| at_least(b, HIGH_VALUE))
        .write_stream()
        .checkpoint_location(&chk)
        .stop_after_batch(risk_last)
        .to_table_in(
            &catalogs,
            RISK,
            TableOptions::new()
                .format(TableFormat::Iceberg)
                .partition_by(["day(ts)"]),
        )
        .await?;

    let store = Arc::new(alerts_store(&options.lake).await?);
    let chk = checkpoints.join("payments-alerts");
    let alerts_last = options.last_batch(&chk).await?;
    let writer = store.clone();
    let alerts = payments()
        .map_batches(|b| at_least(b, ALERT))
        .write_stream()
        .query_name("payments-alerts")
        .checkpoint_location(&chk)
        .stop_after_batch(alerts_last)
        .foreach_batch(move |batches, batch| {
            let store = writer.clone();
            async move { apply_alerts(&store, batches, batch).await }
        })
        .await?;

    for q in [&bronze, &risk, &alerts] {
        q.await_termination().await?;
    }

    // Read each sink back: the payments of batches 0 to its last, once.
    let cents = |id: i64| (id as i128 * 7919) % 100_000; // the rate source's amounts
    let ids = |last: BatchId, from_cents: i128| -> Vec<i64> {
        (0..((last.0 + 1) * rows) as i64)
            .filter(|i| cents(*i) >= from_cents)
            .collect()
    };
    let (all, high, alerted) = (ids(bronze_last, 0), ids(risk_last, HIGH_VALUE), ids(alerts_last, ALERT));
    let location = catalogs.table(BRONZE).await?.location;
    exactly(BRONZE, delta_event_ids(&location).await?, &all)?;
    exactly(RISK, iceberg_ids(&catalogs, RISK).await?, &high)?;
    let stored: Vec<i64> = sqlx::query_scalar("SELECT event_id FROM alerts")
        .fetch_all(&*store)
        .await?;
    exactly("alerts", stored, &alerted)?;
    println!("every payment exactly once in all three sinks");
    Ok(())
}
