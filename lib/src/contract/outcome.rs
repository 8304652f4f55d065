//! What an attempt reports: the outcome, its usage, outputs and evidence.

use super::{Level, Reason, Status};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The facts about one attempt.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Outcome {
    /// What became of the attempt.
    pub status: Status,
    /// A stable word saying why, when the status alone does not.
    pub reason: Option<Reason>,
    /// The job the attempt belongs to.
    #[serde(default)]
    pub job_id: String,
    /// Which attempt of the job (1-based).
    #[serde(default)]
    pub attempt: u32,
    /// The worker it ran for.
    #[serde(default)]
    pub worker: String,
    /// The handler's or command's error text; empty on success.
    pub handler_error: String,
    /// The exit code; `None` when killed by a signal or unknown.
    pub exit_code: Option<i32>,
    /// The signal that killed the main process, if one did.
    pub signal: Option<i32>,
    /// Retrying cannot help.
    pub permanent: bool,
    /// Resources used.
    pub usage: Usage,
    /// Regular files found in the output dir, for every attempt whose sandbox ran.
    pub outputs: Vec<OutputFile>,
    /// Facts gathered along the way.
    pub evidence: Evidence,
    /// The in-process handler's own error value; never serialised.
    #[serde(skip)]
    pub cause: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

/// Now, as milliseconds since the Unix epoch (the unit of the evidence's timestamps).
pub fn unix_ms_now() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Outcome {
    /// An outcome with `status` and nothing else known yet.
    pub fn new(status: Status) -> Self {
        Self {
            status,
            reason: None,
            job_id: String::new(),
            attempt: 0,
            worker: String::new(),
            handler_error: String::new(),
            exit_code: None,
            signal: None,
            permanent: false,
            usage: Usage::default(),
            outputs: Vec::new(),
            evidence: Evidence::default(),
            cause: None,
        }
    }

    /// One line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an outcome always serialises")
    }

    /// What a job engine should do next with the job:
    /// - `ok` → [`Next::Done`];
    /// - `permanent` (the handler said so, an unknown handler, a fingerprint mismatch, a
    ///   command that does not exist) → [`Next::GiveUp`]: retrying cannot help;
    /// - cancelled by the caller → [`Next::GiveUp`]: a user's cancellation is not retried;
    /// - `launch_failed` otherwise → [`Next::Requeue`]: the handler never ran, so no retry
    ///   is spent;
    /// - anything else (`handler_error`, `timeout`, `oom_killed`, `killed`) → [`Next::Retry`],
    ///   which uses up one of the job's retries.
    pub fn next(&self) -> Next {
        match self.status {
            Status::Ok => Next::Done,
            _ if self.permanent => Next::GiveUp,
            Status::Killed if self.reason == Some(Reason::Cancelled) => Next::GiveUp,
            Status::LaunchFailed => Next::Requeue,
            _ => Next::Retry,
        }
    }
}

/// What a job engine should do after an attempt (see [`Outcome::next`] and
/// [`crate::LaunchError::next`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Next {
    /// The job is done.
    Done,
    /// Run it again, spending one of its retries.
    Retry,
    /// Run it again without spending a retry: it never ran.
    Requeue,
    /// Do not run it again.
    GiveUp,
}

/// Resources an attempt used. A figure that could not be obtained is `None`, never 0,
/// and `sources` says how each figure was obtained or why it is missing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Wall time from start to end of the attempt.
    pub wall_time_ms: Option<u64>,
    /// User + system CPU of everything that ran.
    pub cpu_time_ms: Option<u64>,
    /// High-water mark of memory of the whole sandbox.
    pub peak_memory_bytes: Option<u64>,
    /// Bytes the attempt left in the output dir.
    pub disk_written_bytes: Option<u64>,
    /// The same resources over time, sampled while the command ran (`docs/outcome.md`,
    /// "Timeline"); `sources.timeline` says why it is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Timeline>,
    /// For each figure: how it was obtained, or why it is missing.
    pub sources: Sources,
}

/// The period a [`Timeline`]'s sampling starts at, ms (10 Hz).
pub const TIMELINE_FIRST_PERIOD_MS: u64 = 100;

/// The most samples a [`Timeline`] keeps, so that it takes at most 16 KB of an Outcome's
/// JSON whatever the attempt's length (six figures of up to 12 digits a sample; should the
/// JSON still pass 16 KB, the host thins it further by the same rule).
pub const TIMELINE_MAX_SAMPLES: usize = 192;

/// The attempt's resources over time, sampled by stevedore's init from the attempt's cgroup
/// and its `/out` and `/tmp`. Columns of equal length, one entry per sample, oldest first.
///
/// Sampling starts every `first_period_ms` (100 ms: 10 Hz); when [`TIMELINE_MAX_SAMPLES`]
/// are kept, every second sample is dropped (the first is always kept) and the period
/// doubles, so a long attempt is covered evenly, more coarsely. After the command ended the
/// cgroup's own high-water mark is added as `peak`: the highest memory use, which a sample
/// may have missed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Timeline {
    /// The period sampling started at, in ms.
    pub first_period_ms: u64,
    /// The period at the end (`first_period_ms` doubled once per thinning), in ms.
    pub period_ms: u64,
    /// Times since the command started, in ms.
    pub t_ms: Vec<u64>,
    /// Memory in use by the whole sandbox (the cgroup's `memory.current`, v1
    /// `memory.usage_in_bytes`), bytes; empty when `missing` says why.
    pub memory_bytes: Vec<u64>,
    /// CPU used so far by the whole sandbox (user + system), ms; empty when `missing` says why.
    pub cpu_ms: Vec<u64>,
    /// Processes (and threads) in the sandbox; empty when `missing` says why.
    pub pids: Vec<u64>,
    /// Bytes in `/out`; empty when `missing` says why.
    pub out_bytes: Vec<u64>,
    /// Bytes in `/tmp`; empty when `missing` says why.
    pub tmp_bytes: Vec<u64>,
    /// The cgroup's recorded memory high-water mark, read once the command ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak: Option<TimelinePeak>,
    /// The memory limit the cgroup enforced, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_limit_bytes: Option<u64>,
    /// The CPU limit, in thousandths of a CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_limit_millicpus: Option<u64>,
    /// When the kernel's OOM killer was first seen to have killed in the sandbox, ms since
    /// the command started (the first sample whose count had risen, or the end).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_kill_ms: Option<u64>,
    /// Each column that is empty (`memory_bytes`, `cpu_ms`, ...): why.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub missing: BTreeMap<String, String>,
}

/// The cgroup's recorded memory peak, the last point of a [`Timeline`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TimelinePeak {
    /// When it was read (the command's end), ms since the command started.
    pub t_ms: u64,
    /// The high-water mark, bytes.
    pub memory_bytes: u64,
}

/// How each usage figure was obtained, or why it is missing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Sources {
    /// Of `wall_time_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall_time_ms: Option<Source>,
    /// Of `cpu_time_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_time_ms: Option<Source>,
    /// Of `peak_memory_bytes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<Source>,
    /// Of `disk_written_bytes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_written_bytes: Option<Source>,
    /// Of `evidence.oom_kills`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_kills: Option<Source>,
    /// Of `timeline`: `sampled`, or why there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Source>,
}

/// How a figure was obtained, serialised as one word, or `unavailable: why`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// The kernel's cgroup counters.
    Cgroup,
    /// `getrusage` of the reaped processes.
    Rusage,
    /// Sampled while running.
    Sampled,
    /// The host's monotonic clock.
    HostClock,
    /// The init's monotonic clock (bound-checked against the host's).
    InitClock,
    /// Counted by stevedore's init in the sandbox.
    Init,
    /// Counted from the outputs stevedore extracted.
    Extracted,
    /// Counted by walking the output dir on the host.
    Walked,
    /// The engine's own state (`State.OOMKilled`).
    Engine,
    /// The kubelet's word on the attempt's container (its `OOMKilled`).
    Kubelet,
    /// Missing, and why.
    Unavailable(String),
}

impl Source {
    /// Missing, because `why`.
    pub fn unavailable(why: impl Into<String>) -> Self {
        Source::Unavailable(why.into())
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::Cgroup => "cgroup",
            Source::Rusage => "rusage",
            Source::Sampled => "sampled",
            Source::HostClock => "host_clock",
            Source::InitClock => "init_clock",
            Source::Init => "init",
            Source::Extracted => "extracted",
            Source::Walked => "walked",
            Source::Engine => "engine",
            Source::Kubelet => "kubelet",
            Source::Unavailable(why) => return write!(f, "unavailable: {why}"),
        })
    }
}

impl std::str::FromStr for Source {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "cgroup" => Source::Cgroup,
            "rusage" => Source::Rusage,
            "sampled" => Source::Sampled,
            "host_clock" => Source::HostClock,
            "init_clock" => Source::InitClock,
            "init" => Source::Init,
            "extracted" => Source::Extracted,
            "walked" => Source::Walked,
            "engine" => Source::Engine,
            "kubelet" => Source::Kubelet,
            other => match other.strip_prefix("unavailable: ") {
                Some(why) => Source::Unavailable(why.to_owned()),
                None => return Err(format!("unknown usage source {other:?}")),
            },
        })
    }
}

impl Serialize for Source {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Source {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

pub use stevedore_parse::outputs::{OutputFile, RefusedEntry};

/// What was captured of one output stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogCapture {
    /// Where the capture is (host path), if kept.
    pub path: Option<String>,
    /// Bytes the stream carried in all, including what was not kept.
    pub bytes: u64,
    /// Whether the kept capture is shorter than the stream.
    pub truncated: bool,
}

/// Captures of both streams.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Logs {
    /// Standard output.
    pub stdout: LogCapture,
    /// Standard error.
    pub stderr: LogCapture,
}

/// Which layer set an environment key that a lower layer also set (never the value).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvOverride {
    /// The key.
    pub key: String,
    /// The layer whose value won: `profile`, `request`, `protocol`.
    pub origin: String,
    /// The layers it overrode, lowest first.
    pub overrode: Vec<String>,
}

/// A limit that was narrowed from what the request asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NarrowedLimit {
    /// The limit key.
    pub key: String,
    /// What was asked.
    pub from: u64,
    /// What was applied.
    pub to: u64,
    /// Why (e.g. `profile ceiling`).
    pub why: String,
}

/// What is known of outputs that did not arrive ([`Evidence::outputs_lost`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct OutputsLost {
    /// Why they did not arrive.
    pub why: String,
    /// `true`: what `/out` held beyond what arrived is unknown (nothing could list it once
    /// the init was gone: a container's or a Pod's `/out` goes with its init). `false`: the
    /// host listed `/out` after the loss, and every file not delivered is named in
    /// `refused_outputs` as `not_delivered`.
    pub unknown: bool,
}

/// Facts, not verdicts, about one attempt.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Evidence {
    /// The rung that ran the attempt.
    pub executor: String,
    /// The rung's isolation level, as the attempt showed it: `vm` only when the init saw a
    /// kernel other than the host's (`kernel`), never by a runtime's name alone.
    pub level: Option<Level>,
    /// The kernel the sandbox saw (the first line of its `/proc/version`, as its init read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// The worker ID the attempt ran for.
    pub worker: String,
    /// The boot of the process that ran it.
    pub incarnation: String,
    /// When the attempt started (Unix epoch ms).
    pub started_at_unix_ms: Option<u64>,
    /// When it finished (Unix epoch ms).
    pub finished_at_unix_ms: Option<u64>,
    /// The container's ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The Pod that ran it, as `namespace/name` (the kube rung).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The node it ran on (the kube rung).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The image as named.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The image's ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// The engine's version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_version: Option<String>,
    /// The negotiated API version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// The OCI runtime.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// Enforcement applied: item → how. Presence is the claim.
    pub enforcement: BTreeMap<String, String>,
    /// Enforcement deliberately not applied: item → why.
    pub skipped: BTreeMap<String, String>,
    /// Limits narrowed from what was asked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub limits_narrowed: Vec<NarrowedLimit>,
    /// Output captures.
    pub logs: Logs,
    /// Whether processes outlived the main process and had to be killed.
    pub stragglers_killed: bool,
    /// Processes the kernel OOM-killed in the attempt; `None` when unknown.
    pub oom_kills: Option<u64>,
    /// The engine's own OOM flag, for corroboration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_oom_killed: Option<bool>,
    /// Output entries not followed or hashed.
    pub refused_outputs: Vec<RefusedEntry>,
    /// Set when the outputs did not all arrive (reason `outputs_lost`): `outputs` is then not
    /// all that `/out` held (`docs/outcome.md`, "Outputs lost").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outputs_lost: Option<OutputsLost>,
    /// Environment keys set by more than one layer.
    pub env_overrides: Vec<EnvOverride>,
    /// The handler is still running after the attempt returned (in-process rung only).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub still_running: bool,
    /// Ports published on the host: container port → host address.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub ports: BTreeMap<String, String>,
    /// Claims from inside the sandbox that failed a bound check, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refused_claims: Vec<String>,
    /// How stevedore's init reached the sandbox (e.g. the tools volume and the init's digest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init: Option<String>,
    /// Where the init started as root to write the inputs it was sent over the link: what the
    /// kernel said of it after it dropped to the sandbox user, before the command's fork
    /// (`docs/outcome.md`, "Inputs over the link").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_privileges: Option<stevedore_init::wire::CredentialsSeen>,
    /// The inputs staged: their apparent size in bytes, and the limit that applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inputs: Option<InputsStaged>,
    /// Bytes of live output the caller's channel could not take (the captures have them).
    #[serde(skip_serializing_if = "is_zero")]
    pub live_dropped_bytes: u64,
    /// What the init itself said (its diagnostics), when there is something to say.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub init_diagnostics: Vec<String>,
    /// Whether the attempt ran in a container of the rung's warm pool (`false`: the pool could
    /// not serve it, `skipped.warm_pool` says why); absent when the rung has no pool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warm: Option<bool>,
    /// Named caches the attempt used: name → where, and what it held afterwards.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub caches: BTreeMap<String, CacheUse>,
    /// Set when a restarted worker took the attempt over: how (see `Executor::recover`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovered: Option<String>,
    /// What became of the reports the sandbox sent, when it sent any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reports: Option<ReportsSeen>,
    /// Hooks that failed after the command started (`report: ...`, `outcome: ...`); the
    /// outcome stands regardless.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hook_failures: Vec<String>,
    /// How the outputs came back: within what time, how long it took, whether the time
    /// ran out (then what went before is kept and the rest is named in `refused_outputs` as
    /// `collection_deadline`). Absent when the init sent no record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub collection: Option<CollectionSeen>,
    /// The link to the init was cut and resumed (`docs/link.md`, "Resuming a cut link").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_resumed: Option<LinkResumed>,
    /// Where the attempt's time went (`docs/outcome.md`, "Phases").
    #[serde(skip_serializing_if = "Phases::is_empty")]
    pub phases: Phases,
    /// Other facts worth a line.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// What ran, as far as anything of it can change the result, and its digest
    /// (`docs/outcome.md`, "Action digest"); what `stevedore replay` runs again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<super::Action>,
}

/// When an attempt reached each phase: milliseconds since the rung took it (right after
/// admission, `started_at_unix_ms`). A phase the rung does not have, or the attempt never
/// reached, is absent. Later rungs add phases; none is ever renamed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Phases {
    /// Everything decided (image resolved, limits, names), nothing made yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prepared_ms: Option<u64>,
    /// The inputs where the command will find them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inputs_staged_ms: Option<u64>,
    /// The sandbox made (a container created, or claimed from the pool; the init spawned).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_ms: Option<u64>,
    /// The sandbox started and told to start the command.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    /// The init said the command runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command_started_ms: Option<u64>,
    /// The init's record arrived: the command and its stragglers ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command_ended_ms: Option<u64>,
    /// The outputs came back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outputs_collected_ms: Option<u64>,
    /// The sandbox removed and the Outcome judged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concluded_ms: Option<u64>,
}

impl Phases {
    /// Whether no phase was timed.
    pub fn is_empty(&self) -> bool {
        *self == Phases::default()
    }
}

/// The collection of the outputs, timed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CollectionSeen {
    /// Its deadline: at least `Collection::min`, plus a second per `bytes_per_s` bytes the
    /// output dir held.
    pub deadline_ms: u64,
    /// How long it took.
    pub elapsed_ms: u64,
    /// The deadline ran out: files were left out.
    pub cut: bool,
}

/// A link that was cut and resumed: how often, and whether anything of the init's went
/// missing or came twice.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LinkResumed {
    /// Times the link was resumed.
    pub times: u32,
    /// Frames the init had sent before a cut and no longer kept: the captures miss them.
    pub frames_lost: u64,
    /// Frames sent again that the host already had, and dropped.
    pub frames_again: u64,
}

/// One named cache, as an attempt used it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CacheUse {
    /// The engine volume holding it.
    pub volume: String,
    /// Where it was mounted.
    pub path: String,
    /// What it held after the attempt (outside the disk limit); `None` when unknown.
    pub bytes: Option<u64>,
}

/// What became of the sandbox's reports (claims: they never change the status or usage).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReportsSeen {
    /// Reports the host received from the init.
    pub received: u64,
    /// Handed to the engine's report hook.
    pub delivered: u64,
    /// Dropped by the init's rate limit.
    pub dropped_rate: u64,
    /// Dropped by the init's per-attempt total (or a flood of bytes).
    pub dropped_total: u64,
    /// Dropped because the engine's hook was too slow to keep up.
    pub dropped_slow_hook: u64,
    /// Refused (malformed, too large, naming another attempt), by the init or the host.
    pub refused: u64,
    /// Why the first few were refused.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<String>,
    /// The last progress reported, in percent.
    pub last_progress: Option<f64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What staging the inputs moved.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
// What is left out when empty reads back as empty (`replay` reads Outcomes).
#[serde(default)]
pub struct InputsStaged {
    /// Regular files staged.
    pub files: u64,
    /// Their apparent size in bytes.
    pub bytes: u64,
    /// The most bytes allowed.
    pub limit_bytes: u64,
    /// Entries not staged (FIFOs, sockets, devices), by relative path.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// Files with holes. They count by apparent size against the limit, and are staged in
    /// full: each costs its apparent size where the sandbox runs (the engine's archive
    /// upload, like the process rung's copy, writes the holes as zeros).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sparse: Vec<SparseInput>,
    /// The digest of the tree staged, `sha256:<hex>` (`docs/outcome.md`, "Input tree digest").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<String>,
}

/// An input file with holes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SparseInput {
    /// Its path relative to the input dir.
    pub name: String,
    /// Its size: what it costs where the sandbox runs.
    pub apparent_bytes: u64,
    /// What it holds on the caller's disk.
    pub allocated_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_to_do_next() {
        let with = |status, reason, permanent| {
            let mut o = Outcome::new(status);
            o.reason = reason;
            o.permanent = permanent;
            o.next()
        };
        assert_eq!(with(Status::Ok, None, false), Next::Done);
        assert_eq!(with(Status::HandlerError, None, false), Next::Retry);
        assert_eq!(with(Status::HandlerError, None, true), Next::GiveUp);
        assert_eq!(with(Status::Timeout, Some(Reason::Deadline), false), Next::Retry);
        assert_eq!(with(Status::OomKilled, Some(Reason::Oom), false), Next::Retry);
        assert_eq!(with(Status::Killed, Some(Reason::Cancelled), false), Next::GiveUp);
        assert_eq!(with(Status::Killed, Some(Reason::InitLost), false), Next::Retry);
        assert_eq!(with(Status::LaunchFailed, None, false), Next::Requeue);
        assert_eq!(with(Status::LaunchFailed, Some(Reason::UnknownHandler), true), Next::GiveUp);
        use crate::contract::LaunchError;
        assert_eq!(LaunchError::CancelledBeforeStart.next(), Next::GiveUp);
        assert_eq!(LaunchError::Closed("x".into()).next(), Next::Requeue);
        let never = LaunchError::ImageUnavailable { image: "i".into(), why: "w".into(), permanent: true, source: None };
        assert_eq!(never.next(), Next::GiveUp, "an image missing under pull policy never");
    }

    #[test]
    fn json_names_are_the_contracts() {
        let mut o = Outcome::new(Status::HandlerError);
        o.exit_code = Some(3);
        o.usage.wall_time_ms = Some(12);
        o.usage.sources.cpu_time_ms = Some(Source::unavailable("test"));
        o.usage.sources.wall_time_ms = Some(Source::HostClock);
        o.job_id = "j".into();
        o.attempt = 2;
        o.outputs.push(OutputFile {
            name: "a b/c".into(),
            size: 1,
            hash: format!("sha256:{}", "0".repeat(64)),
            content_type: "text/plain".into(),
        });
        o.evidence.oom_kills = Some(0);
        o.evidence.worker = "w".into();
        let v: serde_json::Value = serde_json::from_str(&o.to_json()).unwrap();
        for k in
            ["status", "reason", "handler_error", "exit_code", "signal", "permanent", "usage", "outputs", "evidence"]
        {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        assert_eq!(v["status"], "handler_error");
        assert!(v["reason"].is_null());
        assert!(v["signal"].is_null());
        for k in ["wall_time_ms", "cpu_time_ms", "peak_memory_bytes", "disk_written_bytes", "sources"] {
            assert!(v["usage"].get(k).is_some(), "missing usage.{k}");
        }
        assert!(v["usage"]["cpu_time_ms"].is_null(), "unknown is null, never 0");
        assert_eq!(v["usage"]["sources"]["cpu_time_ms"], "unavailable: test");
        assert_eq!(v["usage"]["sources"]["wall_time_ms"], "host_clock");
        assert_eq!((v["job_id"].as_str(), v["attempt"].as_u64()), (Some("j"), Some(2)));
        for k in ["name", "size", "hash", "content_type"] {
            assert!(v["outputs"][0].get(k).is_some());
        }
        for k in ["oom_kills", "worker", "incarnation", "logs"] {
            assert!(v["evidence"].get(k).is_some(), "missing evidence.{k}");
        }
        for s in ["stdout", "stderr"] {
            for k in ["path", "bytes", "truncated"] {
                assert!(v["evidence"]["logs"][s].get(k).is_some());
            }
        }
        let back: Outcome = serde_json::from_value(v).unwrap();
        assert_eq!(back.status, Status::HandlerError);
        assert_eq!(back.exit_code, Some(3));
        assert_eq!(back.outputs, o.outputs);
        assert_eq!(back.evidence, o.evidence);
        assert_eq!(back.usage, o.usage);
    }
}
