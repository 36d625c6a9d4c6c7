//! A service the benchmarks start with the project's own scripts
//! (`scripts/services/NAME.sh start DIR`), stopped when dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A service started for this run.
pub struct Started {
    script: PathBuf,
    dir: tempfile::TempDir,
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../scripts/services/{name}.sh"))
}

impl Started {
    /// Starts service `name` and returns it with the variables its script
    /// prints for export.
    pub fn start(name: &str) -> (Started, Vec<(String, String)>) {
        let dir = tempfile::tempdir().unwrap();
        let script = script(name);
        let out = Command::new(&script)
            .arg("start")
            .arg(dir.path())
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("{} runs: {e}", script.display()));
        assert!(out.status.success(), "{name} did not start");
        let exports = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        (Started { script, dir }, exports)
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = Command::new(&self.script).arg("stop").arg(self.dir.path()).status();
    }
}

/// The suite's PostgreSQL (`WEIR_TEST_POSTGRES_URL`), or one started for
/// this run.
pub struct Postgres {
    /// `postgres://...`.
    pub url: String,
    _started: Option<Started>,
}

impl Postgres {
    /// The suite's PostgreSQL, or a new one.
    pub fn start() -> Postgres {
        if let Ok(url) = std::env::var("WEIR_TEST_POSTGRES_URL") {
            return Postgres { url, _started: None };
        }
        let (started, exports) = Started::start("postgres");
        let url = exports
            .into_iter()
            .find_map(|(k, v)| (k == "WEIR_TEST_POSTGRES_URL").then_some(v))
            .expect("the script names the URL");
        Postgres {
            url,
            _started: Some(started),
        }
    }
}
