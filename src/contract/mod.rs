//! The engine-agnostic contract: types, the `Executor` trait, the registry.

mod error;
mod executor;
pub mod incarnation;
mod level;
pub mod limits;
mod outcome;
mod policy;
mod registry;
mod request;
pub mod status;

pub use error::{Cause, LaunchError, error_chain};
pub use executor::{BoxFuture, Executor, ReclaimError, ReclaimFailure, ReclaimReport};
pub use level::Level;
pub use limits::{ParseError, ResourceLimits, parse_cpus, parse_duration, parse_size};
pub use outcome::{
    EnvOverride, Evidence, LogCapture, Logs, NarrowedLimit, Outcome, OutputFile, RefusedEntry, Usage, unix_ms_now,
};
pub use policy::{DEFAULT_GRACE, Policy};
pub use registry::{Registry, SelectError};
pub use request::{MAX_PAYLOAD_BYTES, PriorOutput, Request, RequestError, Task, valid_worker_id};
pub use status::{Exit, Facts, Status, Verdict, decide, reason};
