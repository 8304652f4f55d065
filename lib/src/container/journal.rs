//! What each of a worker's attempts made on the engine, on record in stevedore's private
//! state dir (`<base>/state/<worker>/<attempt id>`, `hostdir`) from before each create until
//! its removal: a restarted worker's `reclaim` removes what a crash left by name, even when
//! the engine lists labels slowly or not at all.

use crate::hostdir::{self, PrivateDir};
use serde::{Deserialize, Serialize};

/// The objects of one attempt.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Entry {
    pub containers: Vec<String>,
    pub volumes: Vec<String>,
}

/// One attempt's record.
#[derive(Debug)]
pub(crate) struct Journal {
    dir: PrivateDir,
    attempt_id: String,
}

/// The worker's state dir (made when missing).
fn worker_dir(worker: &str) -> Result<PrivateDir, hostdir::HostDirError> {
    PrivateDir::open(&hostdir::default_base())?.subdir("state")?.subdir(worker)
}

/// A record longer than this is not a record of stevedore's.
const MAX_ENTRY: u64 = 1 << 20;

impl Journal {
    /// The record of `attempt_id`, or `None` (and a warning) when the state dir cannot be
    /// used: the labels still carry the attempt for `reclaim`.
    pub fn open(worker: &str, attempt_id: &str) -> Option<Self> {
        match worker_dir(worker) {
            Ok(dir) if hostdir::safe_name(attempt_id) => Some(Self { dir, attempt_id: attempt_id.to_owned() }),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, "no state dir: what a crash leaves is found by its labels only");
                None
            }
        }
    }

    /// Records `entry`, replacing what was recorded; an empty one removes the record.
    pub fn write(&self, entry: &Entry) {
        let done = if entry.containers.is_empty() && entry.volumes.is_empty() {
            match self.dir.remove_file(&self.attempt_id) {
                Err(hostdir::HostDirError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                    Ok(())
                }
                other => other,
            }
        } else {
            let bytes = serde_json::to_vec(entry).expect("an entry always serialises");
            self.dir.replace_file(&self.attempt_id, &bytes)
        };
        if let Err(e) = done {
            tracing::warn!(error = %e, attempt_id = %self.attempt_id, "the state dir did not take the attempt's record");
        }
    }
}

/// What `worker`'s attempts recorded: (attempt id, its objects). A record that is not one
/// of stevedore's is skipped (and left alone).
pub(crate) fn recorded(worker: &str) -> Vec<(String, Entry)> {
    let Ok(dir) = worker_dir(worker) else { return Vec::new() };
    let Ok(files) = dir.files() else { return Vec::new() };
    files
        .into_iter()
        .filter(|f| !f.contains(".new-"))
        .filter_map(|f| {
            let bytes = dir.read_file(&f, MAX_ENTRY).ok()?;
            Some((f, serde_json::from_slice(&bytes).ok()?))
        })
        .collect()
}

/// Forgets `attempt_id`'s record, once what it names is gone.
pub(crate) fn forget(worker: &str, attempt_id: &str) {
    if let Some(j) = Journal::open(worker, attempt_id) {
        j.write(&Entry::default());
    }
}
