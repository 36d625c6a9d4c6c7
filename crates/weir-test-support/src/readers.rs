//! The independent readers of `integration/readers` (Python deltalake,
//! DuckDB), run from tests. `scripts/test.sh` installs them in
//! `.venv-readers`; CI requires them, elsewhere tests report them missing.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The readers' Python (`WEIR_READERS_PYTHON`, else `.venv-readers`), if it
/// exists. Under [`crate::strict`] it must.
pub fn python() -> Option<PathBuf> {
    let python = std::env::var_os("WEIR_READERS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".venv-readers/bin/python"));
    if python.exists() {
        return Some(python);
    }
    assert!(
        !crate::strict(),
        "the independent readers are missing ({}); scripts/test.sh installs them",
        python.display()
    );
    None
}

/// Runs `read_table.py` with `args` and parses its JSON; `None` (with a
/// notice) when the readers are not installed and the run is not strict.
pub fn read(args: &[&str]) -> Option<serde_json::Value> {
    script("read_table.py", args)
}

/// Runs `alter_table.py` (another engine changing a table: a new column, a
/// constraint, a new partitioning) with `args`; `None` as for [`read`].
pub fn alter(args: &[&str]) -> Option<serde_json::Value> {
    script("alter_table.py", args)
}

/// Runs `read_iceberg.py` (pyiceberg and DuckDB on an Iceberg table of a
/// SQL catalog) with `args`; `None` as for [`read`].
pub fn iceberg(args: &[&str]) -> Option<serde_json::Value> {
    script("read_iceberg.py", args)
}

/// The event ids of Iceberg table `table` of `catalog` (as
/// `read_iceberg.py` takes it) by `reader` (`pyiceberg`, `duckdb` or
/// `duckdb-dir`), with the reader's amount checksum in cents.
pub fn iceberg_ids(reader: &str, catalog: &str, table: &str) -> Option<(Vec<i64>, Option<i64>)> {
    let out = iceberg(&["ids", reader, catalog, table])?;
    Some((json_ids(&out), out["amount_cents"].as_i64()))
}

/// The `ids` array of a reader's answer.
pub fn json_ids(out: &serde_json::Value) -> Vec<i64> {
    out["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|v| v.as_i64().expect("an integer id"))
        .collect()
}

fn script(name: &str, args: &[&str]) -> Option<serde_json::Value> {
    let Some(python) = python() else {
        eprintln!("SKIPPED: the independent readers are not installed; run scripts/test.sh to install them");
        return None;
    };
    let out = Command::new(python)
        .arg(workspace().join("integration/readers").join(name))
        .args(args)
        .output()
        .expect("run the reader");
    assert!(
        out.status.success(),
        "{name} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).expect("the reader prints JSON"))
}

/// The event ids in the table by `reader` (`deltalake` or `duckdb`), with
/// the reader's amount checksum in cents.
pub fn event_ids_with(reader: &str, table: &str) -> Option<(Vec<i64>, Option<i64>)> {
    let json = read(&["ids", reader, table])?;
    Some((json_ids(&json), json["amount_cents"].as_i64()))
}

/// The rate source's `amount` summed in cents over event ids `0..n`.
pub fn rate_amount_cents(n: i64) -> i64 {
    (0..n).map(|i| (i * 7919) % 100_000).sum()
}

/// Spark (Delta Lake on Spark and Iceberg's Spark runtime, the formats'
/// reference implementations) in one JVM that answers requests until it is
/// dropped (`read_spark.py` says what a request is), so a test file starts
/// Spark once.
pub struct Spark {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Spark {
    /// Starts Spark; `None` when the readers or Spark's jars are missing
    /// and the run is not [`crate::strict`].
    pub fn start() -> Option<Self> {
        let python = python()?;
        let jars = std::env::var_os("WEIR_SPARK_JARS")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace().join(".cache/spark-jars"));
        if !jars.join(".pom").exists() {
            assert!(
                !crate::strict(),
                "Spark's jars are missing ({}); scripts/test.sh fetches them",
                jars.display()
            );
            eprintln!("SKIPPED: Spark's jars are missing; scripts/spark-jars.sh fetches them");
            return None;
        }
        let mut child = Command::new(python)
            .arg(workspace().join("integration/readers/read_spark.py"))
            .env("WEIR_SPARK_JARS", &jars)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start Spark");
        let stdin = child.stdin.take();
        let stdout = std::io::BufReader::new(child.stdout.take().expect("Spark's stdout"));
        Some(Self { child, stdin, stdout })
    }

    /// Sends one request and returns Spark's answer: its result, or
    /// `{"error": ...}` when Spark refused.
    pub fn run(&mut self, request: serde_json::Value) -> serde_json::Value {
        use std::io::{BufRead as _, Write as _};
        let stdin = self.stdin.as_mut().expect("Spark is running");
        writeln!(stdin, "{request}").expect("send a request to Spark");
        stdin.flush().expect("send a request to Spark");
        let mut line = String::new();
        let read = self.stdout.read_line(&mut line).expect("read Spark's answer");
        assert!(read > 0, "Spark stopped before answering {request} (its log is above)");
        serde_json::from_str(&line).expect("Spark's answer is JSON")
    }

    /// Runs `request` and panics with Spark's error if it refused.
    pub fn ok(&mut self, request: serde_json::Value) -> serde_json::Value {
        let answer = self.run(request.clone());
        assert!(
            answer.get("error").is_none(),
            "Spark refused {request}: {}",
            answer["error"]
        );
        answer
    }
}

impl Drop for Spark {
    fn drop(&mut self) {
        // Closing its input ends the reader, which stops Spark.
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// What a reader's answer (`{"ids", "amount_cents"}`, or `{"error"}`) gets
/// wrong about a table that should hold the rate source's rows with ids
/// `expected`, each once: `None` when it is right. Amounts are checked
/// when the reader summed them.
pub fn wrong_rows(answer: &serde_json::Value, expected: impl IntoIterator<Item = i64>) -> Option<String> {
    if let Some(e) = answer.get("error") {
        return Some(format!("refused: {e}"));
    }
    let mut ids = json_ids(answer);
    ids.sort_unstable();
    let mut expected: Vec<i64> = expected.into_iter().collect();
    expected.sort_unstable();
    if ids != expected {
        let repeated = ids.windows(2).filter(|w| w[0] == w[1]).count();
        let found: std::collections::HashSet<i64> = ids.iter().copied().collect();
        let missing = expected.iter().filter(|id| !found.contains(id)).count();
        return Some(format!(
            "{} rows, not {}: {missing} ids missing, {repeated} repeated",
            ids.len(),
            expected.len()
        ));
    }
    let cents: i64 = expected.iter().map(|i| (i * 7919) % 100_000).sum();
    match answer["amount_cents"].as_i64() {
        Some(found) if found != cents => Some(format!("amounts sum to {found} cents, not {cents}")),
        _ => None,
    }
}
