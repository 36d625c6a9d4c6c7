//! The test S3 (SeaweedFS, started by scripts/test.sh): checkpoint URLs of
//! a test's own, and configurations whose catalog keeps its tables there.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::{json_lines, weir};

/// A test's own prefix on the test S3, with its checkpoint URL.
pub struct S3 {
    pub endpoint: String,
    bucket: String,
    /// A checkpoint URL of the test's own.
    pub chk: String,
}

/// The test S3 with a fresh prefix for `name`, or `None` outside the test
/// script (its absence fails under CI).
pub fn s3(name: &str) -> Option<S3> {
    let endpoint = weir_test_support::service("WEIR_TEST_S3_ENDPOINT")?;
    let bucket = std::env::var("WEIR_TEST_S3_BUCKET").unwrap_or_else(|_| "weir".into());
    let chk = format!("s3://{bucket}/cli-checkpoints/{}/{name}/", uuid::Uuid::new_v4());
    Some(S3 { endpoint, bucket, chk })
}

impl S3 {
    /// Another checkpoint URL beside [`S3::chk`], for one of several
    /// queries.
    pub fn checkpoint(&self, name: &str) -> String {
        format!("{}{name}/", self.chk)
    }

    /// `weir` on `lake` with the store configured from the environment,
    /// as a user would.
    pub fn weir(&self, lake: &Path) -> Command {
        let mut command = weir(lake);
        command
            .env("AWS_ENDPOINT", &self.endpoint)
            .env("AWS_ALLOW_HTTP", "true");
        command
    }

    /// `weir checkpoint show` of [`S3::chk`].
    pub fn show(&self, lake: &Path) -> Value {
        self.show_at(lake, &self.chk)
    }

    /// `weir checkpoint show` of `chk`.
    pub fn show_at(&self, lake: &Path, chk: &str) -> Value {
        let out = self
            .weir(lake)
            .args(["checkpoint", "show", chk, "--json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        json_lines(&String::from_utf8(out.stdout).unwrap()).remove(0)
    }

    /// A configuration in `lake` whose catalog `lake` (SQL at `uri`) keeps
    /// its tables on the test S3, new ones in `format`.
    pub fn tables_config(&self, lake: &Path, uri: &str, format: &str) -> PathBuf {
        let warehouse = format!("s3://{}/cli-tables/{}/warehouse", self.bucket, uuid::Uuid::new_v4());
        self.config(
            lake,
            &format!("type = \"sql\"\nuri = \"{uri}\"\nwarehouse = \"{warehouse}\"\nformat = \"{format}\""),
        )
    }

    /// A configuration in `lake` whose catalog `lake` is the test Iceberg
    /// REST catalog at `uri`, its tables in `warehouse` on the test S3.
    pub fn rest_config(&self, lake: &Path, uri: &str, warehouse: &str) -> PathBuf {
        let credential = "${AWS_ACCESS_KEY_ID}:${AWS_SECRET_ACCESS_KEY}";
        self.config(
            lake,
            &format!("type = \"rest\"\nuri = \"{uri}\"\nwarehouse = \"{warehouse}\"\ncredential = \"{credential}\""),
        )
    }

    /// Writes `lake/weir.toml`: the catalog `lake` as `catalog` says, its
    /// storage the test S3 with the environment's credentials.
    fn config(&self, lake: &Path, catalog: &str) -> PathBuf {
        let config = format!(
            r#"default_catalog = "lake"

[catalogs.lake]
{catalog}

[catalogs.lake.storage]
"s3.endpoint" = "{}"
"s3.region" = "us-east-1"
"s3.access-key-id" = "${{AWS_ACCESS_KEY_ID}}"
"s3.secret-access-key" = "${{AWS_SECRET_ACCESS_KEY}}"
"#,
            self.endpoint
        );
        let file = lake.join("weir.toml");
        std::fs::write(&file, config).unwrap();
        file
    }

    /// `weir` with `config`, and the checkpoint's store from the
    /// environment.
    pub fn weir_with(&self, config: &Path) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_weir"));
        command
            .env("WEIR_CONFIG", config)
            .env("AWS_ENDPOINT", &self.endpoint)
            .env("AWS_ALLOW_HTTP", "true");
        command
    }
}
