//! The S3 the benchmarks write to: the suite's, or SeaweedFS started for
//! the run.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// An S3 endpoint with a bucket, and the SeaweedFS started for it (stopped
/// when dropped).
pub struct S3Service {
    /// Its address (`http://127.0.0.1:PORT`).
    pub endpoint: String,
    /// The bucket the benchmarks write under.
    pub bucket: String,
    started: Option<tempfile::TempDir>,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/services/seaweedfs.sh")
}

impl S3Service {
    /// The suite's S3, or a new SeaweedFS. Its credentials and region go
    /// into this process's environment, where S3 clients read them.
    pub fn start() -> S3Service {
        if let Ok(endpoint) = std::env::var("WEIR_TEST_S3_ENDPOINT") {
            return S3Service {
                endpoint,
                bucket: std::env::var("WEIR_TEST_S3_BUCKET").unwrap_or_else(|_| "weir".into()),
                started: None,
            };
        }
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(script())
            .arg("start")
            .arg(dir.path())
            .stderr(Stdio::inherit())
            .output()
            .expect("scripts/services/seaweedfs.sh runs");
        assert!(out.status.success(), "SeaweedFS did not start");
        for line in String::from_utf8(out.stdout).unwrap().lines() {
            if let Some((key, value)) = line.strip_prefix("export ").and_then(|l| l.split_once('=')) {
                std::env::set_var(key, value);
            }
        }
        S3Service {
            endpoint: std::env::var("WEIR_TEST_S3_ENDPOINT").expect("the script names the endpoint"),
            bucket: std::env::var("WEIR_TEST_S3_BUCKET").unwrap_or_else(|_| "weir".into()),
            started: Some(dir),
        }
    }

    /// `s3://BUCKET/path`.
    pub fn url(&self, path: &str) -> String {
        format!("s3://{}/{path}", self.bucket)
    }
}

impl Drop for S3Service {
    fn drop(&mut self) {
        if let Some(dir) = &self.started {
            let _ = Command::new(script()).arg("stop").arg(dir.path()).status();
        }
    }
}
