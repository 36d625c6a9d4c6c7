//! What a sink under test gives the suite, and where a case keeps its
//! checkpoints.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use weir_core::sink::Sink;
use weir_core::StreamWriter;

/// A sink under test, on one table.
#[async_trait]
pub trait SinkHarness: Send + Sync {
    /// A new handle on the table under test, as a restarted process would
    /// open it. The table may be created by the sink's `prepare`.
    async fn sink(&self) -> Arc<dyn Sink>;

    /// A handle on a different table: the same other table on every call.
    async fn other_sink(&self) -> Arc<dyn Sink>;

    /// Drops the table and makes a new empty one at the same place, as a
    /// restore or a re-creation would.
    async fn recreate_table(&self);

    /// The `event_id` of every row in the table, read back (by an
    /// independent reader where the sink is a table format).
    async fn read_event_ids(&self) -> Vec<i64>;

    /// Whether, in Update mode, a row replaces the sink's row of the same
    /// group (a table sink's upsert), rather than following it (a log of
    /// changes, as Kafka keeps).
    fn replaces_groups(&self) -> bool {
        false
    }

    /// Why the suite cannot run here (a service that is not running), if so.
    /// The cases then print the reason and do nothing; a harness must not
    /// give a reason in CI, where every service is started.
    fn skip_reason(&self) -> Option<String> {
        None
    }

    /// Where the cases keep their checkpoints: a new local directory for
    /// each unless the harness names object storage, where each case takes
    /// a fresh prefix under it.
    fn checkpoints(&self) -> Option<ObjectCheckpoints> {
        None
    }
}

/// Checkpoints on object storage: a URL prefix (`s3://bucket/prefix`), the
/// options a query opens it with, and the bucket's store, to copy and
/// inspect checkpoints behind the query's back.
#[derive(Clone)]
pub struct ObjectCheckpoints {
    /// The store of the URL's bucket (the URL's path is a path in it).
    pub store: Arc<dyn ObjectStore>,
    /// The prefix under which every case makes its checkpoints.
    pub url: String,
    /// The query's `checkpoint_options`.
    pub options: HashMap<String, String>,
}

#[cfg(feature = "s3")]
impl ObjectCheckpoints {
    /// Checkpoints under `prefix` in the test S3's bucket
    /// (`WEIR_TEST_S3_ENDPOINT`, `WEIR_TEST_S3_BUCKET`), with the
    /// credentials and region of the environment and a lease short enough
    /// for a case to see it pass on; `None` without the test S3.
    pub fn test_s3(prefix: &str) -> Option<Self> {
        let endpoint = crate::service("WEIR_TEST_S3_ENDPOINT")?;
        let bucket = std::env::var("WEIR_TEST_S3_BUCKET").unwrap_or_else(|_| "weir".into());
        let store = object_store::aws::AmazonS3Builder::from_env()
            .with_endpoint(&endpoint)
            .with_allow_http(true)
            .with_bucket_name(&bucket)
            .build()
            .expect("an S3 store");
        let options = [
            ("aws_endpoint", endpoint.as_str()),
            ("aws_allow_http", "true"),
            ("lease_ttl_ms", "6000"),
            ("lease_renew_ms", "500"),
            ("lease_clock_skew_ms", "1000"),
        ];
        Some(Self {
            store: Arc::new(store),
            url: format!("s3://{bucket}/{}", prefix.trim_matches('/')),
            options: options.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        })
    }
}

#[cfg(feature = "azure")]
impl ObjectCheckpoints {
    /// Checkpoints under `prefix` in the test Azurite's container
    /// (`WEIR_TEST_AZURE_ENDPOINT`, `WEIR_TEST_AZURE_CONTAINER`), opened
    /// with Azurite's published development account, as an `az://` URL;
    /// `None` without the test Azurite.
    pub fn test_azure(prefix: &str) -> Option<Self> {
        /// Azurite's well-known development account and key (not secrets).
        const ACCOUNT: &str = "devstoreaccount1";
        const KEY: &str = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
        let endpoint = crate::service("WEIR_TEST_AZURE_ENDPOINT")?;
        let container = std::env::var("WEIR_TEST_AZURE_CONTAINER").unwrap_or_else(|_| "weir".into());
        let options = [
            ("azure_storage_account_name", ACCOUNT),
            ("azure_storage_account_key", KEY),
            ("azure_storage_endpoint", endpoint.as_str()),
            ("azure_allow_http", "true"),
            ("lease_ttl_ms", "6000"),
            ("lease_renew_ms", "500"),
            ("lease_clock_skew_ms", "1000"),
        ];
        let mut builder = object_store::azure::MicrosoftAzureBuilder::new().with_container_name(&container);
        for (key, value) in &options[..4] {
            builder = builder.with_config(key.parse().expect("an Azure option"), *value);
        }
        Some(Self {
            store: Arc::new(builder.build().expect("an Azure store")),
            url: format!("az://{container}/{}", prefix.trim_matches('/')),
            options: options.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        })
    }
}

/// One case's checkpoint: a local directory or a fresh prefix on object
/// storage.
pub(super) enum CaseCheckpoint {
    Dir(tempfile::TempDir),
    Object {
        objects: ObjectCheckpoints,
        url: String,
        /// The checkpoint's root in `objects.store`.
        root: ObjectPath,
    },
}

impl CaseCheckpoint {
    /// A new, empty checkpoint where the harness keeps them.
    pub(super) fn new(h: &dyn SinkHarness) -> Self {
        let Some(objects) = h.checkpoints() else {
            return Self::Dir(tempfile::tempdir().expect("tempdir"));
        };
        let url = format!("{}/{}", objects.url.trim_end_matches('/'), uuid::Uuid::new_v4());
        let root = ObjectPath::from(
            url::Url::parse(&url)
                .expect("a checkpoint URL")
                .path()
                .trim_matches('/'),
        );
        Self::Object { objects, url, root }
    }

    /// The location a query is given.
    pub(super) fn location(&self) -> String {
        match self {
            Self::Dir(dir) => dir.path().to_string_lossy().into_owned(),
            Self::Object { url, .. } => url.clone(),
        }
    }

    /// `writer` with this checkpoint as its location.
    pub(super) fn on(&self, writer: StreamWriter) -> StreamWriter {
        let writer = writer.checkpoint_location(self.location());
        match self {
            Self::Dir(_) => writer,
            Self::Object { objects, .. } => writer.checkpoint_options(objects.options.clone()),
        }
    }

    /// Whether the checkpoint holds the file `relative` (as `commits/1`).
    pub(super) async fn has(&self, relative: &str) -> bool {
        match self {
            Self::Dir(dir) => dir.path().join(relative).exists(),
            Self::Object { objects, root, .. } => {
                let path = relative.split('/').fold(root.clone(), |p, part| p.join(part));
                match objects.store.head(&path).await {
                    Ok(_) => true,
                    Err(object_store::Error::NotFound { .. }) => false,
                    Err(e) => panic!("head {path}: {e}"),
                }
            }
        }
    }

    /// Copies this checkpoint into `to` (an old copy of it), as a restore
    /// from a backup would.
    pub(super) async fn copy_to(&self, to: &CaseCheckpoint) {
        match (self, to) {
            (Self::Dir(from), Self::Dir(into)) => copy_dir(from.path(), into.path()),
            (
                Self::Object {
                    objects, root: from, ..
                },
                Self::Object { root: into, .. },
            ) => {
                let files: Vec<_> = objects
                    .store
                    .list(Some(from))
                    .try_collect()
                    .await
                    .expect("list the checkpoint");
                for file in files {
                    let relative = file.location.prefix_match(from).expect("under the checkpoint");
                    let target = relative.fold(into.clone(), |p, part| p.join(part));
                    objects
                        .store
                        .copy(&file.location, &target)
                        .await
                        .expect("copy a checkpoint file");
                }
            }
            _ => unreachable!("both checkpoints are where the harness keeps them"),
        }
    }
}

/// Copies a directory tree (a checkpoint, to make an old copy of it).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the copy");
    for entry in std::fs::read_dir(from).expect("read the checkpoint") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy a file");
        }
    }
}
