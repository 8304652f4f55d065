//! The host side of the link to stevedore's init (`docs/link.md`): the frames the host
//! sends, the reader that routes the init's frames, the command's captures and live output,
//! and the checks on the init's record. Shared by every rung that runs the init.

mod capture;
pub(crate) mod claims;
pub(crate) mod judgement;
pub(crate) mod reports;
pub(crate) mod session;
pub(crate) mod supervise;

pub(crate) use capture::{CappedLog, LiveSink};
pub use supervise::{Collection, HostLoss};
