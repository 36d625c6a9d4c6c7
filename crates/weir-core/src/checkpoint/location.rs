//! Opening a checkpoint by its location: a local path, a `file://` URL, or
//! an object store URL (`s3://`, `gs://`, `az://`, `abfss://`) with the
//! options of its store.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use object_store::{ObjectStore, ObjectStoreScheme};

use super::lease::LeaseTiming;
use super::{CheckpointStore, LocalStore, ObjectStoreCheckpoint};
use crate::error::{Error, Result};

/// The options of a checkpoint on object storage that weir reads itself
/// (in milliseconds); every other option goes to the store.
#[allow(dead_code)]
const LEASE_OPTIONS: [&str; 3] = ["lease_ttl_ms", "lease_renew_ms", "lease_clock_skew_ms"];

fn invalid(reason: impl Into<String>) -> Error {
    Error::InvalidOption {
        option: "checkpoint_location",
        reason: reason.into(),
    }
}

/// The store of the checkpoint at `location` with `options`.
///
/// A location with a scheme other than `file://` is an object store URL;
/// its store is configured from the environment (`AWS_*`, `GOOGLE_*`,
/// `AZURE_*`, as `object_store` reads them) and then from `options`, named
/// as `object_store` names them (`aws_endpoint`, `aws_allow_http`, ...), plus
/// the lease's `lease_ttl_ms`, `lease_renew_ms` and `lease_clock_skew_ms`.
pub(crate) fn open(location: &str, options: &HashMap<String, String>) -> Result<Arc<dyn CheckpointStore>> {
    let Some((scheme, _)) = location.split_once("://") else {
        return open_local(location, options);
    };
    if scheme == "file" {
        return open_local(&location["file://".len()..], options);
    }
    let url = url::Url::parse(location).map_err(|e| invalid(format!("{location:?} is not a valid URL: {e}")))?;
    let (kind, root) = ObjectStoreScheme::parse(&url)
        .map_err(|e| invalid(format!("{location:?} names no object store weir knows: {e}")))?;
    let mut timing = LeaseTiming::default();
    let mut store_options = Vec::new();
    for (key, value) in options {
        let ms = || {
            value
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| invalid(format!("option {key} must be a number of milliseconds, not {value:?}")))
        };
        match key.as_str() {
            "lease_ttl_ms" => timing.ttl = ms()?,
            "lease_renew_ms" => timing.renew_every = ms()?,
            "lease_clock_skew_ms" => timing.clock_skew = ms()?,
            _ => store_options.push((key.as_str(), value.as_str())),
        }
    }
    if let Some(reason) = timing.problem() {
        return Err(invalid(reason));
    }
    let store = build(kind, location, &store_options)?;
    let shown = location.trim_end_matches('/').to_string();
    ObjectStoreCheckpoint::new(store, root, shown)
        .with_lease_timing(timing)
        .map(|c| Arc::new(c) as Arc<dyn CheckpointStore>)
}

fn open_local(path: &str, options: &HashMap<String, String>) -> Result<Arc<dyn CheckpointStore>> {
    if let Some(key) = options.keys().next() {
        return Err(invalid(format!(
            "option {key} applies to checkpoints on object storage, and {path:?} is a local directory"
        )));
    }
    Ok(Arc::new(LocalStore::open(path)?))
}

/// Applies `options` to a builder, refusing one its store does not know.
#[allow(unused_macros)]
macro_rules! configured {
    ($builder:expr, $key:ty, $options:expr, $scheme:literal) => {{
        let mut builder = $builder;
        for (key, value) in $options {
            let parsed: $key = key.parse().map_err(|_| {
                invalid(format!(
                    "{key} is not an option of {} checkpoints (nor one of weir's: {})",
                    $scheme,
                    LEASE_OPTIONS.join(", ")
                ))
            })?;
            builder = builder.with_config(parsed, *value);
        }
        builder
    }};
}

#[allow(unused_variables)]
fn build(kind: ObjectStoreScheme, location: &str, options: &[(&str, &str)]) -> Result<Arc<dyn ObjectStore>> {
    let missing = |feature: &str| {
        invalid(format!(
            "{location} needs weir-core's `{feature}` feature, which this build lacks (the `weir` crate enables it)"
        ))
    };
    match kind {
        ObjectStoreScheme::AmazonS3 => {
            #[cfg(feature = "s3")]
            {
                use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
                let builder = AmazonS3Builder::from_env().with_url(location);
                let builder = configured!(builder, AmazonS3ConfigKey, options, "s3://");
                return built(location, builder.build());
            }
            #[allow(unreachable_code)]
            Err(missing("s3"))
        }
        ObjectStoreScheme::GoogleCloudStorage => {
            #[cfg(feature = "gcs")]
            {
                use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
                let builder = GoogleCloudStorageBuilder::from_env().with_url(location);
                let builder = configured!(builder, GoogleConfigKey, options, "gs://");
                return built(location, builder.build());
            }
            #[allow(unreachable_code)]
            Err(missing("gcs"))
        }
        ObjectStoreScheme::MicrosoftAzure => {
            #[cfg(feature = "azure")]
            {
                use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
                let builder = MicrosoftAzureBuilder::from_env().with_url(location);
                let builder = configured!(builder, AzureConfigKey, options, "Azure");
                return built(location, builder.build());
            }
            #[allow(unreachable_code)]
            Err(missing("azure"))
        }
        other => Err(invalid(format!(
            "{location}: a checkpoint cannot live on {other:?}; use a local directory or an s3://, gs://, az:// or abfss:// URL"
        ))),
    }
}

#[allow(dead_code)]
fn built<S: ObjectStore>(location: &str, store: object_store::Result<S>) -> Result<Arc<dyn ObjectStore>> {
    match store {
        Ok(store) => Ok(Arc::new(store)),
        Err(e) => Err(invalid(format!("cannot open the store of {location}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(location: &str, options: &[(&str, &str)]) -> String {
        let options = options.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        open(location, &options).unwrap_err().to_string()
    }

    #[test]
    fn local_paths_and_file_urls_are_directories() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        let store = open(path.to_str().unwrap(), &HashMap::new()).unwrap();
        assert_eq!(store.location(), path.display().to_string());
        let url = format!("file://{}", dir.path().join("b").display());
        assert_eq!(
            open(&url, &HashMap::new()).unwrap().location(),
            dir.path().join("b").display().to_string()
        );
        let e = refused(path.to_str().unwrap(), &[("aws_endpoint", "http://x")]);
        assert!(e.contains("aws_endpoint") && e.contains("local directory"), "{e}");
    }

    #[test]
    fn bad_locations_and_options_are_refused_by_name() {
        let e = refused("memory:///chk", &[]);
        assert!(e.contains("cannot live on"), "{e}");
        let e = refused("s3://bucket/chk", &[("lease_ttl_ms", "soon")]);
        assert!(e.contains("lease_ttl_ms") && e.contains("milliseconds"), "{e}");
        let e = refused("s3://bucket/chk", &[("lease_renew_ms", "20000")]);
        assert!(e.contains("renew at least twice"), "{e}");
    }

    #[cfg(feature = "s3")]
    #[test]
    fn an_unknown_store_option_is_refused_by_name() {
        let e = refused("s3://bucket/chk", &[("aws_endpont", "http://127.0.0.1:1")]);
        assert!(e.contains("aws_endpont") && e.contains("s3://"), "{e}");
        let ok: HashMap<_, _> = [
            ("aws_endpoint".to_string(), "http://127.0.0.1:1".to_string()),
            ("aws_region".to_string(), "us-east-1".to_string()),
            ("lease_ttl_ms".to_string(), "60000".to_string()),
        ]
        .into();
        assert_eq!(open("s3://bucket/chk/", &ok).unwrap().location(), "s3://bucket/chk");
    }
}
