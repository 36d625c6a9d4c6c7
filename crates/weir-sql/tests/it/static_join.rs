//! The static side of a join is read again only when its version changed,
//! and a table whose columns changed is refused by name.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use weir_core::prelude::*;
use weir_core::BoxError;
use weir_sql::{StaticTable, StreamSqlExt};

/// How the table changes at a version.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Change {
    /// A column is added before the others.
    AddColumn,
    /// The `bonus` column is dropped.
    DropBonus,
    /// The table does not answer (transiently).
    Unavailable,
}

/// A table of (id, bonus = id * version) whose version the test moves.
#[derive(Debug, Default)]
struct Moving {
    version: AtomicI64,
    reads: AtomicUsize,
    /// From this version on, the table is changed so.
    change: Option<(i64, Change)>,
}

fn schema(change: Option<Change>) -> SchemaRef {
    let mut fields = vec![Field::new("id", DataType::Int64, false)];
    if change == Some(Change::AddColumn) {
        fields.insert(0, Field::new("extra", DataType::Int64, false));
    }
    if change != Some(Change::DropBonus) {
        fields.push(Field::new("bonus", DataType::Int64, false));
    }
    Arc::new(Schema::new(fields))
}

impl Moving {
    fn change_now(&self) -> Option<Change> {
        let v = self.version.load(Ordering::SeqCst);
        self.change.filter(|(at, _)| v >= *at).map(|(_, c)| c)
    }
}

#[async_trait]
impl StaticTable for Moving {
    fn schema(&self) -> SchemaRef {
        schema(None)
    }

    async fn version(&self) -> Result<Option<i64>, BoxError> {
        if self.change_now() == Some(Change::Unavailable) {
            return Err(weir_core::transient("the catalog did not answer"));
        }
        Ok(Some(self.version.load(Ordering::SeqCst)))
    }

    async fn read(&self) -> Result<(Option<i64>, Vec<RecordBatch>), BoxError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let v = self.version.load(Ordering::SeqCst);
        let change = self.change_now();
        let mut columns: Vec<arrow_array::ArrayRef> = vec![Arc::new(Int64Array::from_iter_values(0..4))];
        if change == Some(Change::AddColumn) {
            columns.insert(0, Arc::new(Int64Array::from_iter_values(0..4)));
        }
        if change != Some(Change::DropBonus) {
            columns.push(Arc::new(Int64Array::from_iter_values((0..4).map(|i| i * v))));
        }
        Ok((Some(v), vec![RecordBatch::try_new(schema(change), columns)?]))
    }
}

fn ids(from: i64, to: i64) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(from..to))]).unwrap()
}

async fn run_batches(table: Arc<Moving>, steps: &[i64]) -> (MemorySink, Result<(), Error>) {
    let chk = tempfile::tempdir().unwrap();
    let input = MemoryStream::new(ids(0, 1).schema());
    let sink = MemorySink::new("t");
    let q = read_stream(input.clone())
        .join_static(
            "bonuses",
            table.clone(),
            "SELECT i.id, b.bonus FROM input i JOIN bonuses b ON i.id % 4 = b.id",
        )
        .write_stream()
        .checkpoint_location(chk.path())
        .trigger(Trigger::processing_time(Duration::ZERO))
        .start(sink.clone())
        .await
        .unwrap();
    for (n, version) in steps.iter().enumerate() {
        table.version.store(*version, Ordering::SeqCst);
        input.add_batch(ids(n as i64 * 4, n as i64 * 4 + 4)).unwrap();
        for _ in 0..2000 {
            if q.recent_progress().len() > n || q.exception().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let outcome = q.stop_and_wait().await;
    (sink, outcome)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_is_read_again_only_when_its_version_changed() {
    let table = Arc::new(Moving::default());
    let (sink, outcome) = run_batches(table.clone(), &[1, 1, 1, 3]).await;
    outcome.unwrap();
    assert_eq!(table.reads.load(Ordering::SeqCst), 2, "versions 1 and 3");
    let mut rows: Vec<(i64, i64)> = sink
        .batches()
        .iter()
        .flat_map(|b| {
            let (i, v) = (
                b.column(0).as_primitive::<Int64Type>(),
                b.column(1).as_primitive::<Int64Type>(),
            );
            (0..b.num_rows()).map(|r| (i.value(r), v.value(r))).collect::<Vec<_>>()
        })
        .collect();
    rows.sort();
    // Batches 0-2 joined version 1 (bonus = id % 4), batch 3 version 3.
    let expected: Vec<(i64, i64)> = (0..16).map(|i| (i, (i % 4) * if i < 12 { 1 } else { 3 })).collect();
    assert_eq!(rows, expected);
}

/// A column added to the table since the query was planned is left out;
/// a planned column that is gone stops the query, naming the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_added_column_is_left_out_and_a_dropped_one_is_refused_by_name() {
    let added = Arc::new(Moving {
        change: Some((2, Change::AddColumn)),
        ..Moving::default()
    });
    let (sink, outcome) = run_batches(added, &[1, 2]).await;
    outcome.unwrap();
    assert_eq!(sink.batches().iter().map(|b| b.num_rows()).sum::<usize>(), 8);

    let dropped = Arc::new(Moving {
        change: Some((2, Change::DropBonus)),
        ..Moving::default()
    });
    let (sink, outcome) = run_batches(dropped, &[1, 2]).await;
    let err = outcome.unwrap_err();
    assert!(err.to_string().contains("bonuses"), "{err}");
    assert!(err.to_string().contains("\"bonus\" is gone"), "{err}");
    assert!(!err.retryable(), "a dropped column is no passing fault");
    // The first batch landed; the second did not.
    assert_eq!(sink.batches().iter().map(|b| b.num_rows()).sum::<usize>(), 4);
}

/// A table that does not answer stops the query with an error a
/// supervisor may retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_that_does_not_answer_stops_the_query_retryably() {
    let table = Arc::new(Moving {
        change: Some((2, Change::Unavailable)),
        ..Moving::default()
    });
    let (_, outcome) = run_batches(table, &[1, 2]).await;
    let err = outcome.unwrap_err();
    assert!(err.to_string().contains("did not answer"), "{err}");
    assert!(err.retryable(), "{err}");
}
