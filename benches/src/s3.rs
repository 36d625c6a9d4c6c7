//! The S3 the benchmarks write to: the suite's, or SeaweedFS started for
//! the run.

use crate::service::Started;

/// An S3 endpoint with a bucket (and an Iceberg REST catalog), and the
/// SeaweedFS started for it (stopped when dropped).
pub struct S3Service {
    /// Its address (`http://127.0.0.1:PORT`).
    pub endpoint: String,
    /// The bucket the benchmarks write under.
    pub bucket: String,
    _started: Option<Started>,
}

impl S3Service {
    /// The suite's S3, or a new SeaweedFS. Its credentials, region and
    /// REST catalog go into this process's environment, where S3 clients
    /// read them.
    pub fn start() -> S3Service {
        let started = match std::env::var("WEIR_TEST_S3_ENDPOINT") {
            Ok(_) => None,
            Err(_) => {
                let (started, exports) = Started::start("seaweedfs");
                for (key, value) in exports {
                    std::env::set_var(key, value);
                }
                Some(started)
            }
        };
        S3Service {
            endpoint: std::env::var("WEIR_TEST_S3_ENDPOINT").expect("the script names the endpoint"),
            bucket: std::env::var("WEIR_TEST_S3_BUCKET").unwrap_or_else(|_| "weir".into()),
            _started: started,
        }
    }

    /// `s3://BUCKET/path`.
    pub fn url(&self, path: &str) -> String {
        format!("s3://{}/{path}", self.bucket)
    }
}
