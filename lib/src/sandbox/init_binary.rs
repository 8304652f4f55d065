//! stevedore's init, embedded at build time as a static executable (see `build.rs`): what
//! every container of the container rung runs as PID 1, and what the process rung runs as
//! the command's supervisor.

static BYTES: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/stevedore-init"));

/// The target triple the init was built for.
pub const TARGET: &str = env!("STEVEDORE_INIT_TARGET");

/// The init's bytes; `None` when this build embeds none (a client that is not Linux).
pub fn bytes() -> Option<&'static [u8]> {
    (!BYTES.is_empty()).then_some(BYTES)
}

/// The init's sha256, as 64 lowercase hex digits (of no bytes when none is embedded).
pub fn sha256() -> &'static str {
    // Taken by `build.rs` from the very file embedded above.
    env!("STEVEDORE_INIT_SHA256")
}

/// The CPU architecture the init runs on, as an engine reports it (`uname -m`).
pub fn arch() -> &'static str {
    TARGET.split('-').next().unwrap_or("unknown")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_init_is_a_static_executable() {
        let bytes = bytes().expect("linux builds embed the init");
        assert_eq!(&bytes[..4], b"\x7fELF");
        // No PT_INTERP program header: no dynamic loader runs it.
        let phoff = u64::from_le_bytes(bytes[0x20..0x28].try_into().unwrap()) as usize;
        let phentsize = u16::from_le_bytes(bytes[0x36..0x38].try_into().unwrap()) as usize;
        let phnum = u16::from_le_bytes(bytes[0x38..0x3a].try_into().unwrap()) as usize;
        for i in 0..phnum {
            let at = phoff + i * phentsize;
            let kind = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
            assert_ne!(kind, 3, "PT_INTERP found: the init is dynamically linked");
        }
        assert_eq!(sha256().len(), 64);
        assert!(bytes.len() < 8 << 20, "a stripped init, not a debug build: {} bytes", bytes.len());
    }
}
