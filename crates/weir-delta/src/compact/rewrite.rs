//! Compaction's rewrite phase: a group's small files read one at a time
//! and written as files of the target size, on a thread of the job's own.

use super::*;

/// What every rewrite of a job shares.
pub(super) struct Job {
    pub(super) table: String,
    pub(super) store: Arc<dyn ObjectStore>,
    pub(super) schema: SchemaRef,
    pub(super) compression: Compression,
    pub(super) num_indexed_cols: usize,
    pub(super) stats_columns: Option<Vec<String>>,
    pub(super) partition_columns: Vec<String>,
    /// For the commit info.
    pub(super) target: u64,
    pub(super) prefix: String,
    /// For a table on a local disk: its files as its store names them,
    /// written straight from the encoder.
    pub(super) disk: Option<object_store::local::LocalFileSystem>,
    /// The log's own path of each live file whose path is not plain, by
    /// its decoded path (see [`raw_paths`]).
    pub(super) raw_paths: HashMap<String, String>,
}

impl Job {
    pub(super) fn store_err(&self, path: &str) -> impl Fn(object_store::Error) -> DeltaSinkError + '_ {
        let path = path.to_string();
        move |source| DeltaSinkError::Store {
            table: self.table.clone(),
            path: path.clone(),
            source,
        }
    }

    pub(super) fn parquet_err(&self, path: &str) -> impl Fn(parquet::errors::ParquetError) -> DeltaSinkError + '_ {
        let path = path.to_string();
        move |source| DeltaSinkError::Parquet {
            table: self.table.clone(),
            path: path.clone(),
            source,
        }
    }

    /// Reads a group's files one at a time into one file: at most one input
    /// file (and the next, fetched meanwhile) and the output's open row
    /// group and part are in memory. (A writer's size estimate counts
    /// buffered rows uncompressed, so rolling on it would cut files well
    /// short of the target, and they would be compacted again and again.)
    ///
    /// It runs on a thread of the job's (see [`Compact::rewrite`]): decoding and
    /// encoding are CPU work, and a table on a local disk gets its file
    /// written as row groups close. Store requests (fetches, parts, the
    /// final put) are futures run on `runtime`; the next input's fetch and
    /// the parts upload while this thread encodes. On an error, a row count
    /// that differs from the inputs' statistics, or once `stopped` is set,
    /// the output is deleted.
    pub(super) fn rewrite_blocking(
        &self,
        runtime: &tokio::runtime::Handle,
        stopped: &AtomicBool,
        index: usize,
        group: Vec<Input>,
    ) -> Result<Option<Rewritten>, DeltaSinkError> {
        let Some(outputs) = self.write_group(runtime, stopped, index, &group)? else {
            return Ok(None);
        };
        let rows_out: i64 = outputs.iter().map(|a| a.rows).sum();
        let rows_in: Option<u64> = group.iter().map(|i| i.rows).sum();
        if rows_in.is_some_and(|n| n != rows_out as u64) {
            runtime.block_on(delete_files(&self.store, &outputs));
            return Err(DeltaSinkError::CompactionStopped {
                table: self.table.clone(),
                reason: format!(
                    "group {index} has {} rows by its files' statistics but {rows_out} were written",
                    rows_in.unwrap_or(0)
                ),
            });
        }
        tracing::debug!(
            group = index,
            files_in = group.len(),
            files_out = outputs.len(),
            rows = rows_out,
            "rewrote a group"
        );
        Ok(Some(Rewritten {
            index,
            inputs: group.into_iter().map(|i| i.remove).collect(),
            outputs,
        }))
    }

    /// The group's output file(s), written (`None` once `stopped` is set); see [`rewrite_blocking`](Self::rewrite_blocking).
    pub(super) fn write_group(
        &self,
        runtime: &tokio::runtime::Handle,
        stopped: &AtomicBool,
        index: usize,
        group: &[Input],
    ) -> Result<Option<Vec<AddFile>>, DeltaSinkError> {
        let values: Vec<Option<String>> = {
            let pv = group[0].remove.partition_values.clone().unwrap_or_default();
            self.partition_columns
                .iter()
                .map(|c| pv.get(c).cloned().flatten())
                .collect()
        };
        let output = {
            let dir = partition::directory(&self.partition_columns, &values);
            let name = format!(
                "{}-{:04}-000.{}.parquet",
                self.prefix,
                index,
                self.compression.extension()
            );
            if dir.is_empty() {
                name
            } else {
                format!("{dir}/{name}")
            }
        };
        let mut open: Option<OpenFile> = None;
        // A panic (a malformed input can make the decoder panic) still gives
        // the open file up, its upload aborted, before it goes on.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut next: Option<AbortOnDrop<object_store::Result<Bytes>>> = None;
            for (i, input) in group.iter().enumerate() {
                let path = &input.remove.path;
                let bytes: Bytes = match next.take() {
                    Some(fetch) => runtime.block_on(fetch).unwrap_or_else(|e| {
                        Err(object_store::Error::Generic {
                            store: "fetch",
                            source: Box::new(e),
                        })
                    }),
                    None => runtime.block_on(self.fetch(path)),
                }
                .map_err(self.store_err(path))?;
                // The next input is fetched while this one is rewritten (if
                // it is small enough that holding two stays within the bound).
                if let Some(following) = group.get(i + 1) {
                    if following.remove.size.is_some_and(|n| (n as u64) <= PREFETCH_BYTES) {
                        let (store, path) = (self.store.clone(), following.remove.path.clone());
                        next = Some(AbortOnDrop(runtime.spawn(async move { fetch(&store, &path).await })));
                    }
                }
                let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
                    .and_then(|b| b.with_batch_size(READ_BATCH_ROWS).build())
                    .map_err(self.parquet_err(path))?;
                for batch in reader {
                    if stopped.load(Ordering::Relaxed) {
                        return Ok(None);
                    }
                    let batch = batch.map_err(|e| self.parquet_err(path)(e.into()))?;
                    let rows = self.conform(&batch, path)?;
                    let file = match open.as_mut() {
                        Some(f) => f,
                        None => open.insert(self.create(&output, &values)?),
                    };
                    file.encode(&self.table, &rows)?;
                    if file.part_ready() {
                        runtime.block_on(file.send_if_ready(&self.table, &self.store))?;
                    }
                }
            }
            let Some(mut file) = open.take() else {
                return Ok(Some(Vec::new()));
            };
            if let Err(e) = file.close(&self.table) {
                open = Some(file);
                return Err(e);
            }
            let finished = runtime.block_on(file.finish(&self.table, &self.store, &self.partition_columns))?;
            Ok(Some(vec![finished]))
        }));
        if !matches!(result, Ok(Ok(Some(_)))) {
            if let Some(file) = open.take() {
                runtime.block_on(file.abort());
            }
        }
        result.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    /// The output file at `output` in the partition with `values`: on disk
    /// for a table on a local disk, else in the store.
    pub(super) fn create(&self, output: &str, values: &[Option<String>]) -> Result<OpenFile, DeltaSinkError> {
        let format = FileFormat {
            schema: &self.schema,
            compression: self.compression,
            num_indexed_cols: self.num_indexed_cols,
            stats_columns: self.stats_columns.as_deref(),
        };
        let destination = match &self.disk {
            Some(disk) => Destination::Disk(
                Path::parse(output)
                    .map_err(object_store::Error::from)
                    .and_then(|p| disk.path_to_filesystem(&p))
                    .map_err(self.store_err(output))?,
            ),
            None => Destination::Store,
        };
        OpenFile::create_in(&self.table, output.to_string(), values, &format, destination)
    }

    pub(super) async fn fetch(&self, path: &str) -> object_store::Result<Bytes> {
        fetch(&self.store, path).await
    }

    /// An input file's rows in the table's current columns (see [`conform`]).
    pub(super) fn conform(&self, batch: &RecordBatch, path: &str) -> Result<RecordBatch, DeltaSinkError> {
        conform(&self.table, &self.schema, batch, path)
    }
}

/// The local file system a table on a local disk is in, rooted at the
/// table, so its files are named as its store names them.
pub(super) fn local_disk(url: &Url) -> Option<object_store::local::LocalFileSystem> {
    if url.scheme() != "file" {
        return None;
    }
    let root = url.to_file_path().ok()?;
    object_store::local::LocalFileSystem::new_with_prefix(root).ok()
}
