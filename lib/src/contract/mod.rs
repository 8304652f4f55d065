//! The engine-agnostic contract: the request, the outcome and its words, the one judge,
//! the `Executor` trait every rung implements, and the registry that picks a rung.

pub mod action;
mod checkpoint;
mod error;
mod executor;
mod hooks;
pub mod incarnation;
mod judge;
mod level;
pub mod limits;
mod live;
mod outcome;
mod policy;
mod registry;
mod request;
mod status;

pub use action::{ACTION_KEY_FILE_ENV, ACTION_SCHEMA, Action, ActionInputs, ActionKey, ActionKeyError, ActionTask};
pub use checkpoint::{CHECKPOINT_VERSION, Checkpoint, LinkSecret, RecoverError, Target};
pub use error::LaunchError;
pub use executor::{Executor, ObjectKind, ReclaimError, ReclaimFailure, ReclaimReport};
pub use hooks::{
    AttemptRef, HOOK_TIMEOUT, HookError, HookResult, HookSet, Hooks, Report, ReportKind, SandboxReport, StartedInfo,
};
pub(crate) use judge::{Judgement, judge};
pub use level::{Level, named_vm_grade, shown as level_shown};
pub use limits::{Limits, ParseError, ResourceLimits, parse_cpus, parse_duration, parse_size};
pub(crate) use live::Counting;
pub(crate) use live::REPORT_EVERY;
pub use live::{LiveChunk, LiveOutput, Phase, Progress, ProgressSink, StdinFeed, Stream, Terminal};
pub(crate) use outcome::unix_ms_now;
pub use outcome::{
    CacheUse, CollectionSeen, EnvOverride, Evidence, InputsStaged, LinkResumed, LogCapture, Logs, NarrowedLimit, Next,
    Outcome, OutputFile, OutputsLost, Phases, RefusedEntry, ReportsSeen, Source, Sources, SparseInput,
    TIMELINE_FIRST_PERIOD_MS, TIMELINE_MAX_SAMPLES, Timeline, TimelinePeak, Usage,
};
pub use policy::{DEFAULT_GRACE, ENFORCEABLE, Policy};
pub use registry::{Registry, SelectError};
pub use request::{
    MAX_PAYLOAD_BYTES, PriorOutput, Request, RequestError, Task, parse_user, valid_job_id, valid_worker_id,
};
pub(crate) use status::{Exit, Facts, LaunchFailure, Record};
pub use status::{Reason, Status};
