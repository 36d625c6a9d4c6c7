//! Writing a Delta log checkpoint a row group at a time.
//!
//! A log checkpoint holds one action for every live file. The kernel's own
//! writer puts them all in one uncompressed row group, held in memory until
//! the file closes, and the next checkpoint reads that row group back whole:
//! at 10,000 live files that is 3.6 MB each way, growing with the table, and
//! a streaming process that checkpoints every hundred commits keeps that
//! peak resident. weir writes the same actions (the kernel's reconciled log
//! replay, which keeps the set of file paths it has seen) in Snappy row
//! groups of at most [`ROW_GROUP_BYTES`]. What the writer holds is one row
//! group being encoded and an upload buffer of at most [`UPLOAD_BYTES`]
//! (a larger checkpoint goes up in parts of that size, two at a time); the
//! next checkpoint reads this one back a row group at a time.
//!
//! A query that stops while its checkpoint is being written cuts the writer
//! short at its next row group: the file is only put when it is finished,
//! so a checkpoint cut short is never visible, and `_last_checkpoint` still
//! names the one before.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arrow_array::RecordBatch;
use buoyant_kernel::checkpoint::LastCheckpointHintStats;
use buoyant_kernel::engine::arrow_data::ArrowEngineData;
use buoyant_kernel::Snapshot;
use deltalake::logstore::LogStore;
use deltalake::{ObjectStore, Path};
use object_store::buffered::BufWriter;
use object_store::ObjectStoreExt;
use parquet::arrow::arrow_writer::ArrowWriterOptions;
use parquet::arrow::async_writer::{AsyncArrowWriter, ParquetObjectWriter};
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use tokio::runtime::Handle;

use crate::error::LogCheckpointError;

/// The largest row group a checkpoint is written in, encoded.
pub(crate) const ROW_GROUP_BYTES: usize = 1 << 20;

/// The upload buffer: a checkpoint up to this size is one put, a larger
/// one a multipart upload in parts of this size (S3's smallest part).
const UPLOAD_BYTES: usize = 5 << 20;

/// Parts of a multipart upload in flight at once.
const PARTS_IN_FLIGHT: usize = 2;

/// What writing a log checkpoint did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    /// A checkpoint of that version was there already.
    AlreadyThere,
    /// The checkpoint was written and `_last_checkpoint` points at it.
    New {
        /// Actions in it (files, protocol, metadata, markers, tombstones).
        actions: i64,
        /// Live files in it.
        files: i64,
        /// Its size in bytes.
        bytes: u64,
    },
}

/// Writes the log checkpoint of `version`, unless there is one.
pub(crate) async fn write(log_store: &dyn LogStore, version: u64) -> Result<Written, LogCheckpointError> {
    write_in(log_store, version, ROW_GROUP_BYTES).await
}

/// Tells the blocking writer to stop when the future waiting for it is
/// dropped (a query's stop aborts the task awaiting it).
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// [`write`] in row groups of at most `row_group_bytes`.
async fn write_in(
    log_store: &dyn LogStore,
    version: u64,
    row_group_bytes: usize,
) -> Result<Written, LogCheckpointError> {
    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    write_until(log_store, version, row_group_bytes, stop.0.clone()).await
}

/// [`write_in`], cut short (and nothing put) once `stopped` is set.
async fn write_until(
    log_store: &dyn LogStore,
    version: u64,
    row_group_bytes: usize,
    stopped: Arc<AtomicBool>,
) -> Result<Written, LogCheckpointError> {
    let cut_short = move || match stopped.load(Ordering::Relaxed) {
        true => Err(LogCheckpointError::Cancelled),
        false => Ok(()),
    };
    let root = log_store.transaction_url(None)?;
    let engine = log_store.engine(None);
    let store = log_store.root_object_store(None);
    let handle = Handle::current();
    // The kernel's log replay blocks; so does this writer, on the runtime's
    // handle, from a thread of the blocking pool.
    tokio::task::spawn_blocking(move || {
        let snapshot = Snapshot::builder_for(root).at_version(version).build(engine.as_ref())?;
        let writer = snapshot.create_checkpoint_writer()?;
        let path = Path::from_url_path(writer.checkpoint_path()?.path()).map_err(object_store::Error::from)?;
        if handle.block_on(store.head(&path)).is_ok() {
            return Ok(Written::AlreadyThere);
        }
        let data = writer.checkpoint_data(engine.as_ref())?;
        let state = data.state();
        let mut parquet: Option<AsyncArrowWriter<ParquetObjectWriter>> = None;
        for batch in data {
            cut_short()?;
            let batch: RecordBatch = ArrowEngineData::try_from_engine_data(batch?.apply_selection_vector()?)?.into();
            let out = match parquet.as_mut() {
                Some(out) => out,
                None => parquet.insert(open(store.clone(), path.clone(), &batch, row_group_bytes)?),
            };
            handle.block_on(out.write(&batch))?;
        }
        let out = parquet.ok_or(LogCheckpointError::Empty)?;
        cut_short()?;
        handle.block_on(out.close())?;
        let bytes = handle.block_on(store.head(&path))?.size;
        let state = Arc::into_inner(state)
            .ok_or_else(|| buoyant_kernel::Error::internal_error("the checkpoint's replay is still shared"))?;
        let (actions, files) = (state.actions_count(), state.add_actions_count());
        let stats = LastCheckpointHintStats::from_reconciliation_state(state, bytes, 0)?;
        writer.finalize(engine.as_ref(), &stats)?;
        Ok(Written::New { actions, files, bytes })
    })
    .await?
}

/// A Parquet writer for the checkpoint at `path`, in the schema of its first
/// batch and row groups of at most `row_group_bytes` (a positive number),
/// without Arrow's schema in the footer (as the kernel writes it).
fn open(
    store: Arc<dyn ObjectStore>,
    path: Path,
    first: &RecordBatch,
    row_group_bytes: usize,
) -> Result<AsyncArrowWriter<ParquetObjectWriter>, LogCheckpointError> {
    let properties = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_bytes(Some(row_group_bytes))
        .build();
    let options = ArrowWriterOptions::new()
        .with_properties(properties)
        .with_skip_arrow_metadata(true);
    let upload = BufWriter::with_capacity(store, path, UPLOAD_BYTES).with_max_concurrency(PARTS_IN_FLIGHT);
    Ok(AsyncArrowWriter::try_new_with_options(
        ParquetObjectWriter::from_buf_writer(upload),
        first.schema(),
        options,
    )?)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path as FsPath;

    use deltalake::DeltaTableBuilder;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use serde_json::json;
    use url::Url;

    use super::*;

    /// A log of five commits: 120 files added by three, ten of them
    /// removed by the fourth, a query's marker at 3.
    fn write_log(log: &FsPath) {
        std::fs::create_dir_all(log).unwrap();
        let schema = json!({"type": "struct", "fields": [
            {"name": "id", "type": "long", "nullable": true, "metadata": {}}]});
        let now = chrono::Utc::now().timestamp_millis();
        let mut commits = vec![vec![
            json!({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}),
            json!({"metaData": {"id": "t", "format": {"provider": "parquet", "options": {}},
                "schemaString": schema.to_string(), "partitionColumns": [],
                "configuration": {}, "createdTime": now}}),
        ]];
        for v in 1..=3 {
            let mut actions = vec![json!({"txn": {"appId": "q", "version": v}})];
            actions.extend((0..40).map(|i| {
                let stats = json!({"numRecords": 1, "minValues": {"id": i}, "maxValues": {"id": i},
                    "nullCount": {"id": 0}});
                json!({"add": {"path": format!("part-{v}-{i:03}.parquet"), "partitionValues": {},
                    "size": 500, "modificationTime": now, "dataChange": true,
                    "stats": stats.to_string()}})
            }));
            commits.push(actions);
        }
        commits.push(
            (0..10)
                .map(|i| {
                    json!({"remove": {"path": format!("part-1-{i:03}.parquet"),
                        "deletionTimestamp": now, "dataChange": true}})
                })
                .collect(),
        );
        for (v, actions) in commits.iter().enumerate() {
            let lines: Vec<String> = actions.iter().map(|a| a.to_string()).collect();
            std::fs::write(log.join(format!("{v:020}.json")), lines.join("\n")).unwrap();
        }
    }

    #[test]
    fn a_store_failure_is_retryable_however_deeply_wrapped() {
        let timeout = || object_store::Error::Generic {
            store: "S3",
            source: "connection reset".into(),
        };
        let missing = || object_store::Error::NotFound {
            path: "t/_delta_log".into(),
            source: "gone".into(),
        };
        let wrapped =
            |e: object_store::Error| LogCheckpointError::Parquet(parquet::errors::ParquetError::External(Box::new(e)));
        assert!(wrapped(timeout()).retryable());
        assert!(!wrapped(missing()).retryable());
        assert!(LogCheckpointError::Kernel(buoyant_kernel::Error::ObjectStore(timeout())).retryable());
        assert!(!LogCheckpointError::Kernel(buoyant_kernel::Error::ObjectStore(missing())).retryable());
        assert!(!LogCheckpointError::Empty.retryable());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_checkpoint_in_small_row_groups_holds_the_live_files_and_markers() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("_delta_log");
        write_log(&log);
        let url = Url::from_directory_path(dir.path()).unwrap();
        let table = DeltaTableBuilder::from_url(url.clone()).unwrap().load().await.unwrap();

        let written = write_in(table.log_store().as_ref(), 4, 2048).await.unwrap();
        let Written::New { actions, files, bytes } = written else {
            panic!("no checkpoint was written: {written:?}")
        };
        // Protocol, metadata, the marker, 110 live files, 10 tombstones.
        assert_eq!((actions, files), (123, 110));
        let path = log.join(format!("{:020}.checkpoint.parquet", 4));
        assert_eq!(bytes, std::fs::metadata(&path).unwrap().len());
        let file = std::fs::File::open(&path).unwrap();
        let groups = SerializedFileReader::new(file).unwrap().metadata().num_row_groups();
        assert!(groups > 3, "{groups} row groups at a 2 KiB limit");
        let hint: serde_json::Value =
            serde_json::from_slice(&std::fs::read(log.join("_last_checkpoint")).unwrap()).unwrap();
        assert_eq!((hint["version"].as_u64(), hint["size"].as_i64()), (Some(4), Some(123)));
        assert_eq!(
            write_in(table.log_store().as_ref(), 4, 2048).await.unwrap(),
            Written::AlreadyThere
        );

        // With the commits it summarises gone, the checkpoint alone gives the
        // table: the live files, and the marker.
        for v in 0..=4 {
            std::fs::remove_file(log.join(format!("{v:020}.json"))).unwrap();
        }
        let table = DeltaTableBuilder::from_url(url.clone()).unwrap().load().await.unwrap();
        let files: BTreeSet<String> = table
            .snapshot()
            .unwrap()
            .log_data()
            .iter()
            .map(|f| f.path().to_string())
            .collect();
        let expected: BTreeSet<String> = (1..=3)
            .flat_map(|v| (0..40).map(move |i| (v, i)))
            .filter(|(v, i)| *v > 1 || *i >= 10)
            .map(|(v, i)| format!("part-{v}-{i:03}.parquet"))
            .collect();
        assert_eq!(files, expected);
        let engine = table.log_store().engine(None);
        let marker = tokio::task::spawn_blocking(move || {
            let snapshot = Snapshot::builder_for(url).build(engine.as_ref()).unwrap();
            snapshot.get_app_id_version("q", engine.as_ref()).unwrap()
        })
        .await
        .unwrap();
        assert_eq!(marker, Some(3));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopped_writer_leaves_no_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("_delta_log");
        write_log(&log);
        let url = Url::from_directory_path(dir.path()).unwrap();
        let table = DeltaTableBuilder::from_url(url).unwrap().load().await.unwrap();

        let stopped = Arc::new(AtomicBool::new(true));
        let err = write_until(table.log_store().as_ref(), 4, 2048, stopped)
            .await
            .unwrap_err();
        assert!(matches!(err, LogCheckpointError::Cancelled), "{err}");
        assert!(err.retryable());
        let left: Vec<String> = std::fs::read_dir(&log)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| !name.ends_with(".json"))
            .collect();
        assert!(left.is_empty(), "a stopped writer left {left:?}");

        // Not stopped, the same writer writes it.
        let written = write_until(table.log_store().as_ref(), 4, 2048, Arc::default())
            .await
            .unwrap();
        assert!(matches!(written, Written::New { files: 110, .. }), "{written:?}");
    }
}
