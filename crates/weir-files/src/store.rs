//! The output directory as an object store: a local directory or an `s3://`
//! prefix.

use std::collections::HashMap;
use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::ObjectStore;

use crate::error::FileSinkError;

/// Where a sink writes: the store, the directory in it, and how the
/// location is shown.
#[derive(Debug, Clone)]
pub(crate) struct Output {
    pub store: Arc<dyn ObjectStore>,
    pub root: Path,
    pub shown: String,
}

impl Output {
    /// Opens `location` (a local path, created if `create`, or
    /// `s3://bucket/prefix`) with object storage `options` for S3 (`aws_endpoint`, `aws_access_key_id`, ...,
    /// as object_store names them; the environment's `AWS_*` are read too).
    pub(crate) fn open(location: &str, options: &HashMap<String, String>, create: bool) -> Result<Self, FileSinkError> {
        let err = |reason: String| FileSinkError::Location {
            location: location.to_string(),
            reason,
        };
        if let Some(rest) = location.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(err("no bucket".into()));
            }
            let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
            for (k, v) in options {
                let key = k.parse().map_err(|e| err(format!("storage option {k:?}: {e}")))?;
                builder = builder.with_config(key, v);
            }
            let store = builder.build().map_err(|e| err(e.to_string()))?;
            let root = Path::parse(prefix.trim_end_matches('/')).map_err(|e| err(e.to_string()))?;
            return Ok(Output {
                store: Arc::new(store),
                root,
                shown: location.trim_end_matches('/').to_string(),
            });
        }
        if location.contains("://") && !location.starts_with("file://") {
            return Err(err("use a local path or an s3:// URL".into()));
        }
        let path = location.strip_prefix("file://").unwrap_or(location);
        if create {
            std::fs::create_dir_all(path).map_err(|e| err(format!("cannot create the directory: {e}")))?;
        } else if !std::path::Path::new(path).is_dir() {
            return Err(err("there is no such directory".into()));
        }
        let dir = std::fs::canonicalize(path).map_err(|e| err(e.to_string()))?;
        let store = LocalFileSystem::new_with_prefix(&dir).map_err(|e| err(e.to_string()))?;
        Ok(Output {
            store: Arc::new(store),
            root: Path::default(),
            shown: dir.display().to_string(),
        })
    }

    /// `relative` (as the log names files: Hive-escaped directories, not
    /// encoded again) below the output directory.
    pub(crate) fn path(&self, relative: &str) -> Result<Path, FileSinkError> {
        let root = self.root.as_ref();
        let joined = if root.is_empty() {
            relative.to_string()
        } else {
            format!("{root}/{relative}")
        };
        Path::parse(&joined).map_err(|e| FileSinkError::Location {
            location: self.shown.clone(),
            reason: format!("{relative:?} is not a valid path: {e}"),
        })
    }

    /// The part of `path` below the output directory.
    pub(crate) fn relative(&self, path: &Path) -> String {
        path.prefix_match(&self.root)
            .map(|parts| parts.map(|p| p.as_ref().to_string()).collect::<Vec<_>>().join("/"))
            .unwrap_or_else(|| path.to_string())
    }

    pub(crate) fn store_err(&self, path: &str) -> impl Fn(object_store::Error) -> FileSinkError + '_ {
        let path = path.to_string();
        move |source| FileSinkError::Store {
            location: self.shown.clone(),
            path: path.clone(),
            source,
        }
    }
}
