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
    /// The process that made them: its tools volume goes with its attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<String>,
}

impl Entry {
    /// Whether it names nothing.
    pub fn is_empty(&self) -> bool {
        self.containers.is_empty() && self.volumes.is_empty()
    }
}

/// One attempt's record.
#[derive(Debug)]
pub(crate) struct Journal {
    worker: String,
    attempt_id: String,
    incarnation: String,
}

/// The state dir of all workers (made when missing). Under a base another user could move
/// (`hostdir::open_default_base`) it is an error naming that directory and its owner, never a
/// directory of another name: `reclaim` and `recover` look for it here.
fn state_dir() -> Result<PrivateDir, hostdir::HostDirError> {
    hostdir::open_default_base()?.subdir("state")
}

/// The worker's state dir (made when missing).
fn worker_dir(worker: &str) -> Result<PrivateDir, hostdir::HostDirError> {
    state_dir()?.subdir(worker)
}

/// Whether `e` says a directory on the way went away (a neighbour removed the worker's
/// state dir when its last record was forgotten, between our open and our write).
fn vanished(e: &hostdir::HostDirError) -> bool {
    matches!(e, hostdir::HostDirError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
}

/// Opens of the worker's dir a write makes at most: each retry follows a neighbour's
/// removal of the then-empty dir, which needs that neighbour to forget its last record.
const OPENS: usize = 4;

/// A record longer than this is not a record of stevedore's.
const MAX_ENTRY: u64 = 1 << 20;

impl Journal {
    /// The record of `attempt_id`, or `None` (and a warning) when the state dir cannot be
    /// used: the labels still carry the attempt for `reclaim`.
    pub fn open(worker: &str, attempt_id: &str, incarnation: &str) -> Option<Self> {
        match worker_dir(worker) {
            Ok(_) if hostdir::safe_name(attempt_id) => Some(Self {
                worker: worker.to_owned(),
                attempt_id: attempt_id.to_owned(),
                incarnation: incarnation.to_owned(),
            }),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, "no state dir: what a crash leaves is found by its labels only");
                None
            }
        }
    }

    /// Records `entry` (as made by this process), replacing what was recorded; an empty one
    /// removes the record, and
    /// the worker's dir with it when no other record is left (a worker id is often minted
    /// per process: the state dir must not grow with the runs).
    pub fn write(&self, entry: &Entry) {
        let done = if entry.is_empty() {
            self.remove()
        } else {
            let entry = Entry { incarnation: Some(self.incarnation.clone()), ..entry.clone() };
            let bytes = serde_json::to_vec(&entry).expect("an entry always serialises");
            let mut opens = 0;
            loop {
                opens += 1;
                match worker_dir(&self.worker).and_then(|d| d.replace_file(&self.attempt_id, &bytes)) {
                    Err(e) if vanished(&e) && opens < OPENS => continue,
                    other => break other,
                }
            }
        };
        if let Err(e) = done {
            tracing::warn!(error = %e, attempt_id = %self.attempt_id, "the state dir did not take the attempt's record");
        }
    }
}

impl Journal {
    fn remove(&self) -> Result<(), hostdir::HostDirError> {
        let state = match state_dir() {
            Ok(d) => d,
            Err(e) if vanished(&e) => return Ok(()),
            Err(e) => return Err(e),
        };
        let dir = match state.subdir(&self.worker) {
            Ok(d) => d,
            Err(e) if vanished(&e) => return Ok(()),
            Err(e) => return Err(e),
        };
        dir.remove_file(&self.attempt_id)?;
        state.remove_subdir_if_empty(&self.worker).map(|_| ())
    }
}

/// What `worker`'s attempts recorded: (attempt id, its objects). A record that is not one
/// of stevedore's is skipped (and left alone). A state dir under a directory another user
/// owns or can write is the error (`reclaim` reports it); any other failure reads as no record.
pub(crate) fn recorded(worker: &str) -> Result<Vec<(String, Entry)>, hostdir::HostDirError> {
    let state = match state_dir() {
        Ok(d) => d,
        Err(e @ hostdir::HostDirError::Untrusted { .. }) => return Err(e),
        Err(_) => return Ok(Vec::new()),
    };
    let Ok(dir) = state.subdir(worker) else { return Ok(Vec::new()) };
    let Ok(files) = dir.files() else { return Ok(Vec::new()) };
    if files.is_empty() {
        // Looking must not leave a dir behind.
        let _ = state.remove_subdir_if_empty(worker);
    }
    Ok(files
        .into_iter()
        .filter(|f| !f.contains(".new-"))
        .filter_map(|f| {
            let bytes = dir.read_file(&f, MAX_ENTRY).ok()?;
            Some((f, serde_json::from_slice(&bytes).ok()?))
        })
        .collect())
}

/// Forgets `attempt_id`'s record, once what it names is gone.
pub(crate) fn forget(worker: &str, attempt_id: &str) {
    if let Some(j) = Journal::open(worker, attempt_id, "") {
        j.write(&Entry::default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(c: &str) -> Entry {
        Entry { containers: vec![c.to_owned()], ..Entry::default() }
    }

    fn worker_dir_exists(worker: &str) -> bool {
        hostdir::default_base().join("state").join(worker).exists()
    }

    #[test]
    fn the_worker_dir_goes_with_its_last_record_and_a_neighbour_still_records() {
        let worker = format!("w-journal-unit-{:08x}", rand::random::<u32>());
        let a = Journal::open(&worker, "a1", "inc-a").unwrap();
        let b = Journal::open(&worker, "b1", "inc-b").unwrap();
        a.write(&entry("ca"));
        b.write(&entry("cb"));
        let mut got = recorded(&worker).unwrap();
        got.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].1.incarnation.as_deref(), Some("inc-a"), "the record names its process");
        forget(&worker, "a1");
        assert!(worker_dir_exists(&worker), "b's record keeps the dir");
        forget(&worker, "b1");
        assert!(!worker_dir_exists(&worker), "the last record took the dir with it");

        // A neighbour removed the (then empty) dir after this attempt opened its record.
        let c = Journal::open(&worker, "c1", "inc-c").unwrap();
        let d = Journal::open(&worker, "d1", "inc-d").unwrap();
        d.write(&entry("cd"));
        d.write(&Entry::default());
        assert!(!worker_dir_exists(&worker));
        c.write(&entry("cc"));
        assert_eq!(recorded(&worker).unwrap().len(), 1, "c's record is written in a dir made again");
        forget(&worker, "c1");
        assert!(recorded(&worker).unwrap().is_empty());
        assert!(!worker_dir_exists(&worker), "looking leaves no dir behind");
    }
}
