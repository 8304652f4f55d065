//! Walking, hashing and safely extracting outputs: shared by every rung.

mod content_type;
mod extract;
mod hash;
mod name;
mod walk;

pub use content_type::content_type;
pub use extract::{ExtractReport, extract_tar};
pub use hash::{Hashed, hash_reader};
pub use name::escape_name;
pub use walk::{Caps, WalkReport, walk};
