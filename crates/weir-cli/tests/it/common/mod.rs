//! What the command's tests share: a lake directory and the command on it.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use weir_test_support::readers::{json_ids, python, read};

pub mod s3;

/// A lake directory, if the independent readers are installed (outside CI
/// they may be missing).
pub fn lake_with_readers() -> Option<tempfile::TempDir> {
    python()?;
    Some(tempfile::tempdir().unwrap())
}

pub fn weir(lake: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weir"));
    c.arg("--lake")
        .arg(lake.join("weir-lake"))
        .env_remove("WEIR_CONFIG")
        .current_dir(lake);
    c
}

pub fn run(lake: &Path, args: &[&str]) -> Output {
    weir(lake).args(args).output().unwrap()
}

pub fn ok(lake: &Path, args: &[&str]) -> String {
    let out = run(lake, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "weir {args:?} failed: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

pub fn failure(lake: &Path, args: &[&str]) -> String {
    let out = run(lake, args);
    assert!(!out.status.success(), "weir {args:?} should fail");
    String::from_utf8(out.stderr).unwrap()
}

pub fn json_lines(stdout: &str) -> Vec<Value> {
    stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

pub fn delta_ids(table: &Path) -> Vec<i64> {
    json_ids(&read(&["ids", "deltalake", table.to_str().unwrap()]).expect("readers present"))
}

pub fn last_committed(lake: &Path, chk: &str) -> Option<u64> {
    let status = json_lines(&ok(lake, &["checkpoint", "show", chk, "--json"])).remove(0);
    status["last_committed"].as_u64()
}
