//! The storage a checkpoint lives on.

use std::fmt;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::Result;

/// The result of a conditional create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    /// The file did not exist and now holds the given bytes.
    Created,
    /// The file already existed; it holds these bytes and was not changed.
    AlreadyExists(Bytes),
}

/// Who holds a checkpoint's lease, written into the lease for error messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseOwner {
    /// The run of the query that holds the lease.
    pub run_id: String,
    /// The process id of the holder.
    pub pid: u32,
    /// The host name of the holder, where known.
    pub host: String,
    /// When the lease was taken (RFC 3339).
    pub since: String,
    /// What tells the holder's process apart from any other on its
    /// machine, where the system shows it (Linux).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessIdentity>,
}

/// A process, told apart from every other: the machine's boot, the process
/// id namespace, and the process's start time. A process with the same id
/// but another start time is another process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessIdentity {
    /// The machine's boot id (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: String,
    /// The process id namespace (`/proc/self/ns/pid`).
    pub pid_namespace: String,
    /// The process's start, in clock ticks after boot (`/proc/PID/stat`).
    pub start_ticks: u64,
}

impl ProcessIdentity {
    /// This process's identity, where the system shows it.
    pub fn this_process() -> Option<Self> {
        Some(ProcessIdentity {
            boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()?
                .trim()
                .to_string(),
            pid_namespace: std::fs::read_link("/proc/self/ns/pid").ok()?.display().to_string(),
            start_ticks: Self::start_of(std::process::id())?,
        })
    }

    /// When process `pid` of this namespace started, if it runs.
    pub fn start_of(pid: u32) -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command name in parentheses: state is field 3, start
        // time field 22.
        let rest = &stat[stat.rfind(')')? + 1..];
        rest.split_whitespace().nth(19)?.parse().ok()
    }

    /// Whether the process this identifies is gone: it ran on this
    /// machine since its boot, in this process id namespace, and no process
    /// with its id and start time runs now. `false` whenever unsure.
    pub fn is_gone(&self, pid: u32) -> bool {
        let Some(here) = Self::this_process() else {
            return false;
        };
        here.boot_id == self.boot_id
            && here.pid_namespace == self.pid_namespace
            && pid != std::process::id()
            && Self::start_of(pid) != Some(self.start_ticks)
    }
}

impl fmt::Display for LeaseOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "run {} of process {} on {} since {}",
            self.run_id, self.pid, self.host, self.since
        )
    }
}

/// Writes a file's contents into a writer, for
/// [`CheckpointStore::put_written`]. An error that is not the writer's own
/// (the contents could not be made) is of kind `InvalidData`.
pub type WriteContents = Box<dyn FnOnce(&mut dyn std::io::Write) -> std::io::Result<()> + Send>;

impl LeaseOwner {
    /// This process, running `run_id`.
    pub fn this_process(run_id: impl Into<String>) -> Self {
        LeaseOwner {
            run_id: run_id.into(),
            pid: std::process::id(),
            host: Self::this_host(),
            since: chrono::Utc::now().to_rfc3339(),
            process: ProcessIdentity::this_process(),
        }
    }

    /// This machine's host name, as leases record it.
    pub fn this_host() -> String {
        std::env::var("HOSTNAME")
            .ok()
            .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "unknown host".into())
    }
}

/// A held lease; dropping it releases the lease (in the background, where
/// releasing takes a request).
#[async_trait]
pub trait Lease: Send + Sync + fmt::Debug {
    /// Fails with [`crate::Error::LeaseLost`] once this run may no longer
    /// hold the lease: the driver asks before each sink commit.
    fn check(&self) -> Result<()> {
        Ok(())
    }

    /// Releases the lease, so the next run takes it at once.
    async fn release(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

/// The storage of one checkpoint directory. Paths are `/`-separated and
/// relative to the checkpoint's root.
///
/// What weir needs from an implementation:
/// - read-after-write: a `get` or `list` after a successful write sees it;
/// - [`CheckpointStore::put_if_absent`] is atomic: of two concurrent
///   creates of one path exactly one returns `Created`, and a reader sees
///   either no file or the whole file, never part of it;
/// - [`CheckpointStore::put`] replaces a file atomically;
/// - [`CheckpointStore::acquire_lease`] is exclusive while held and is
///   released when its holder dies, so a killed query can be restarted.
#[async_trait]
pub trait CheckpointStore: Send + Sync + fmt::Debug {
    /// Where the checkpoint is, for messages.
    fn location(&self) -> &str;

    /// The whole file at `path`, or `None` if there is none.
    async fn get(&self, path: &str) -> Result<Option<Bytes>>;

    /// Creates `path` with `bytes` unless it exists (atomic, durable).
    async fn put_if_absent(&self, path: &str, bytes: Bytes) -> Result<PutOutcome>;

    /// Creates or replaces `path` with `bytes` (atomic, durable).
    async fn put(&self, path: &str, bytes: Bytes) -> Result<()>;

    /// Creates or replaces `path` with what `contents` writes (atomic,
    /// durable, as [`CheckpointStore::put`]). A store that can takes the
    /// contents as they are written, so a large state file is not gathered
    /// in memory first. By default they are gathered in memory, on the
    /// calling task, and put: a store on a network overrides it (writing
    /// the contents off the async runtime, a part at a time).
    async fn put_written(&self, path: &str, contents: WriteContents) -> Result<()> {
        let mut bytes = Vec::new();
        contents(&mut bytes).map_err(|source| crate::Error::CheckpointIo {
            location: self.location().to_string(),
            path: path.to_string(),
            source,
        })?;
        self.put(path, Bytes::from(bytes)).await
    }

    /// The names of the files directly under `dir` (empty if `dir` is
    /// missing), without files being written.
    async fn list(&self, dir: &str) -> Result<Vec<String>>;

    /// Deletes `path`; deleting a missing file is not an error.
    async fn delete(&self, path: &str) -> Result<()>;

    /// Takes the checkpoint's exclusive lease, or fails with
    /// [`crate::Error::CheckpointInUse`] naming the holder.
    async fn acquire_lease(&self, owner: &LeaseOwner) -> Result<Box<dyn Lease>>;
}
