//! Outputs: extracting (and hashing) the tar the init sends (`stevedore_parse::outputs`,
//! re-exported), walking an output dir on the host (for rungs without a tar), hashing a
//! reader. Shared by every rung.

mod hash;
#[cfg(feature = "oci")]
pub(crate) mod in_place;
mod walk;

pub use hash::hash_reader;
pub use stevedore_parse::outputs::{Caps, ExtractReport, extract_into, hash_backend};
#[cfg(feature = "process")]
pub use walk::list;
pub use walk::{WalkReport, walk};
