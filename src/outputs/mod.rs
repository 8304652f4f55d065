//! Outputs: extracting (and hashing) the tar the init sends (`stevedore_parse::outputs`,
//! re-exported), walking an output dir on the host (for rungs without a tar), hashing a
//! reader. Shared by every rung.

mod hash;
mod walk;

pub use hash::{Hashed, hash_reader};
pub use stevedore_parse::outputs::{Caps, ExtractReport, content_type, extract_into, extract_tar};
pub use walk::{WalkReport, walk};
