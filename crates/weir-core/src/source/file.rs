//! New files in a directory: JSON lines, CSV or Parquet.

use std::collections::HashSet;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{BatchStream, Offset, ReadLimit, Source, SourceContext};
use crate::checkpoint::{CheckpointStore, PutOutcome};
use crate::error::{Error, Result};
use crate::sync::Recover;

const KEY: &str = "file_log_index";
/// The file log's format version; it follows the checkpoint's.
const LOG_VERSION: u32 = crate::checkpoint::FORMAT_VERSION;

/// The format of the files a [`FileSource`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// One JSON object per line.
    JsonLines,
    /// Comma-separated values with a header line.
    Csv,
    /// Parquet; columns are matched to the source schema by name.
    Parquet,
}

/// Reads each new file of a directory once.
///
/// When it plans a batch, the source lists the directory, takes the files it
/// has not seen (oldest first, at most `max_files_per_trigger`), and writes
/// their names into its log in the checkpoint (`sources/<name>/K`) before the
/// batch's offset (`{"file_log_index": K}`) is written. A replayed batch reads
/// exactly the files of its log entries, never a new listing. Files whose
/// name starts with `.` or `_` are skipped (files being written). A file that
/// cannot be parsed fails the batch with an error naming it; nothing of that
/// batch is committed.
///
/// The log keeps every file name the query has seen, so the directory should
/// be rotated by the application (for example one directory per day) when it
/// reaches millions of files.
#[derive(Debug, Clone)]
pub struct FileSource {
    name: String,
    dir: PathBuf,
    format: FileFormat,
    schema: SchemaRef,
    max_files_per_trigger: Option<usize>,
    state: Arc<Mutex<FileState>>,
}

#[derive(Debug, Default)]
struct FileState {
    ctx: Option<SourceContext>,
    seen: HashSet<String>,
    /// Index of the newest log entry.
    last_entry: Option<u64>,
    /// Set by `prepare_for_available_now`: only these files are "now".
    available_now: Option<HashSet<String>>,
}

/// One entry of the file log: the files of one planned range.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct FileLogEntry {
    version: u32,
    files: Vec<FileEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct FileEntry {
    name: String,
    size: u64,
    modified_ms: i64,
}

impl FileSource {
    /// Reads files of `format` with `schema` from `dir`.
    pub fn new(dir: impl Into<PathBuf>, format: FileFormat, schema: SchemaRef) -> Self {
        FileSource {
            name: "files".into(),
            dir: dir.into(),
            format,
            schema,
            max_files_per_trigger: None,
            state: Arc::default(),
        }
    }

    /// Takes at most `n` new files per batch.
    pub fn with_max_files_per_trigger(mut self, n: usize) -> Self {
        self.max_files_per_trigger = Some(n.max(1));
        self
    }

    fn source_err(&self, e: impl Into<crate::error::BoxError>) -> Error {
        Error::Source {
            retryable: false,
            source_name: self.name.clone(),
            source: e.into(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FileState> {
        self.state.lock().recover()
    }

    fn context(&self) -> Result<SourceContext> {
        self.lock()
            .ctx
            .clone()
            .ok_or_else(|| self.source_err("used before open"))
    }

    async fn read_entry(&self, store: &dyn CheckpointStore, path: &str) -> Result<FileLogEntry> {
        let bytes = store.get(path).await?.ok_or_else(|| Error::CorruptCheckpoint {
            location: store.location().into(),
            path: path.into(),
            reason: "the file source's log entry for a planned batch is missing".into(),
        })?;
        // Versioned like every checkpoint file: a newer weir's entry is
        // refused by name, not misread.
        crate::checkpoint::decode(store.location(), path, &bytes)
    }

    /// The directory's files not yet seen, oldest first.
    async fn list_new_files(&self) -> Result<Vec<FileEntry>> {
        let dir = self.dir.clone();
        let listed = tokio::task::spawn_blocking(move || list_files(&dir))
            .await
            .map_err(|e| self.source_err(e))?
            .map_err(|e| self.source_err(format!("cannot list {}: {e}", self.dir.display())))?;
        let state = self.lock();
        let mut new: Vec<FileEntry> = listed
            .into_iter()
            .filter(|f| !state.seen.contains(&f.name))
            .filter(|f| state.available_now.as_ref().is_none_or(|now| now.contains(&f.name)))
            .collect();
        new.sort_by(|a, b| (a.modified_ms, &a.name).cmp(&(b.modified_ms, &b.name)));
        Ok(new)
    }
}

fn list_files(dir: &Path) -> std::io::Result<Vec<FileEntry>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if !meta.is_file() || name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        let modified_ms = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        files.push(FileEntry {
            name,
            size: meta.len(),
            modified_ms,
        });
    }
    Ok(files)
}

fn log_index(source: &str, offset: Option<&Offset>) -> Result<Option<u64>> {
    match offset {
        None => Ok(None),
        Some(o) => {
            o.0.get(KEY)
                .and_then(|v| v.as_u64())
                .map(Some)
                .ok_or_else(|| Error::Source {
                    retryable: false,
                    source_name: source.into(),
                    source: format!("offset {o} has no integer field {KEY:?}").into(),
                })
        }
    }
}

#[async_trait]
impl Source for FileSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> String {
        format!("files {:?} in {}", self.format, self.dir.display())
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    async fn open(&self, ctx: &SourceContext) -> Result<()> {
        let mut seen = HashSet::new();
        let mut last_entry = None;
        let mut indexes: Vec<u64> = ctx
            .store
            .list(&ctx.dir)
            .await?
            .iter()
            .filter_map(|n| n.parse().ok())
            .collect();
        indexes.sort_unstable();
        for index in indexes {
            let entry = self
                .read_entry(ctx.store.as_ref(), &format!("{}/{index}", ctx.dir))
                .await?;
            seen.extend(entry.files.into_iter().map(|f| f.name));
            last_entry = Some(index);
        }
        let mut state = self.lock();
        state.ctx = Some(ctx.clone());
        state.seen = seen;
        state.last_entry = last_entry;
        Ok(())
    }

    async fn latest_offset(&self, start: Option<&Offset>, limit: ReadLimit) -> Result<Option<Offset>> {
        let start = log_index(&self.name, start)?;
        // Entries written by an earlier run that never planned them are
        // offered again as they are, so their files are read exactly once.
        let last_entry = self.lock().last_entry;
        if last_entry > start {
            return Ok(last_entry.map(|i| Offset(json!({ KEY: i }))));
        }
        let mut files = self.list_new_files().await?;
        if files.is_empty() {
            return Ok(start.map(|i| Offset(json!({ KEY: i }))));
        }
        if let (ReadLimit::Default, Some(max)) = (limit, self.max_files_per_trigger) {
            files.truncate(max);
        }
        let ctx = self.context()?;
        let index = last_entry.map(|i| i + 1).unwrap_or(0);
        let entry = FileLogEntry {
            version: LOG_VERSION,
            files,
        };
        let bytes = Bytes::from(serde_json::to_vec(&entry).expect("file log entries serialise"));
        let path = format!("{}/{index}", ctx.dir);
        let entry = match ctx.store.put_if_absent(&path, bytes).await? {
            PutOutcome::Created => entry,
            // A concurrent run of the query wrote it: take its files.
            PutOutcome::AlreadyExists(_) => self.read_entry(ctx.store.as_ref(), &path).await?,
        };
        let mut state = self.lock();
        state.seen.extend(entry.files.into_iter().map(|f| f.name));
        state.last_entry = Some(index);
        Ok(Some(Offset(json!({ KEY: index }))))
    }

    async fn prepare_for_available_now(&self) -> Result<()> {
        let dir = self.dir.clone();
        let listed = tokio::task::spawn_blocking(move || list_files(&dir))
            .await
            .map_err(|e| self.source_err(e))?
            .map_err(|e| self.source_err(format!("cannot list {}: {e}", self.dir.display())))?;
        self.lock().available_now = Some(listed.into_iter().map(|f| f.name).collect());
        Ok(())
    }

    async fn read(&self, start: Option<&Offset>, end: &Offset) -> Result<BatchStream> {
        let from = log_index(&self.name, start)?.map(|i| i + 1).unwrap_or(0);
        let to = log_index(&self.name, Some(end))?.unwrap_or(0);
        let ctx = self.context()?;
        let mut paths = Vec::new();
        for index in from..=to {
            let entry = self
                .read_entry(ctx.store.as_ref(), &format!("{}/{index}", ctx.dir))
                .await?;
            paths.extend(entry.files.into_iter().map(|f| (self.dir.join(f.name), f.size)));
        }
        let (format, schema) = (self.format, self.schema.clone());
        let stream = futures::stream::iter(paths)
            .then(move |(path, size)| {
                let schema = schema.clone();
                async move {
                    tokio::task::spawn_blocking(move || read_file(&path, size, format, &schema))
                        .await
                        .unwrap_or_else(|e| {
                            Err(Error::Source {
                                retryable: false,
                                source_name: "files".into(),
                                source: e.into(),
                            })
                        })
                }
            })
            .flat_map(|file| match file {
                Ok(batches) => futures::stream::iter(batches.into_iter().map(Ok).collect::<Vec<_>>()),
                Err(e) => futures::stream::iter(vec![Err(e)]),
            });
        Ok(stream.boxed())
    }
}

/// Reads a whole file into record batches of `schema`, refusing a file
/// whose size changed since it was planned (a replay would read other rows).
fn read_file(path: &Path, planned_size: u64, format: FileFormat, schema: &SchemaRef) -> Result<Vec<RecordBatch>> {
    let fail = |reason: String| Error::SourceFile {
        path: path.to_path_buf(),
        reason,
    };
    let file = File::open(path).map_err(|e| fail(format!("cannot open a file planned into a batch: {e}")))?;
    let size = file.metadata().map_err(|e| fail(format!("cannot stat: {e}")))?.len();
    if size != planned_size {
        return Err(fail(format!(
            "it had {planned_size} bytes when its batch was planned and has {size} now; files must not change once they are in the directory (write them elsewhere and move them in)"
        )));
    }
    let batches: std::result::Result<Vec<RecordBatch>, arrow_schema::ArrowError> = match format {
        FileFormat::JsonLines => arrow_json::ReaderBuilder::new(schema.clone())
            .build(BufReader::new(file))
            .map_err(|e| fail(e.to_string()))?
            .collect(),
        FileFormat::Csv => arrow_csv::ReaderBuilder::new(schema.clone())
            .with_header(true)
            .build(file)
            .map_err(|e| fail(e.to_string()))?
            .collect(),
        FileFormat::Parquet => return read_parquet(file, schema).map_err(fail),
    };
    batches.map_err(|e| fail(format!("cannot parse: {e}")))
}

fn read_parquet(file: File, schema: &SchemaRef) -> std::result::Result<Vec<RecordBatch>, String> {
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| format!("not a readable Parquet file: {e}"))?;
    let file_schema = builder.schema().clone();
    let mut indices = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let (i, found) = file_schema
            .column_with_name(field.name())
            .ok_or_else(|| format!("has no column {:?}", field.name()))?;
        if found.data_type() != field.data_type() {
            return Err(format!(
                "column {:?} is {}, the source expects {}",
                field.name(),
                found.data_type(),
                field.data_type()
            ));
        }
        indices.push(i);
    }
    let mask = ProjectionMask::roots(builder.parquet_schema(), indices.iter().copied());
    let reader = builder.with_projection(mask).build().map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| format!("cannot decode: {e}"))?;
        // Reorder to the source's column order and nullability.
        let columns = schema
            .fields()
            .iter()
            .map(|f| {
                batch
                    .column_by_name(f.name())
                    .cloned()
                    .ok_or_else(|| format!("lost column {:?}", f.name()))
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        out.push(RecordBatch::try_new(schema.clone(), columns).map_err(|e| e.to_string())?);
    }
    Ok(out)
}
