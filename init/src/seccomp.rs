//! The seccomp filter the oci rung compiles once per worker (`lib/src/oci/seccomp.rs`) and
//! the init installs on itself, first thing, before it reads a frame or runs anything of the
//! image: handed the profile, the runtime would compile it again on every start (runc: about
//! 20 ms of a 40 ms start on this project's machines).
//!
//! The file holds one or more classic BPF programs, installed in order: each a little-endian
//! `u32` count, then that many 8-byte instructions (`code` u16, `jt` u8, `jf` u8, `k` u32,
//! little-endian). Several programs because one program has one action on a match: the kernel
//! runs every installed filter and keeps the strictest answer, the newest among equals
//! (`Documentation/userspace-api/seccomp_filter.rst`).

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The filter's file name beside the init (the oci rung's tools dir).
pub const FILE_NAME: &str = "seccomp.bpf";
/// No filter file is larger: a bound on what the init reads.
const MAX_FILE: u64 = 1 << 20;
/// The kernel's bound on one program (`BPF_MAXINSNS`).
const MAX_PROGRAM: usize = 4096;

/// One classic BPF instruction (`struct sock_filter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    /// The operation.
    pub code: u16,
    /// The jump when true.
    pub jt: u8,
    /// The jump when false.
    pub jf: u8,
    /// The operand.
    pub k: u32,
}

/// The file's bytes for `programs`, in the order they are to be installed.
pub fn encode(programs: &[Vec<Insn>]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in programs {
        out.extend_from_slice(&(p.len() as u32).to_le_bytes());
        for i in p {
            out.extend_from_slice(&i.code.to_le_bytes());
            out.extend_from_slice(&[i.jt, i.jf]);
            out.extend_from_slice(&i.k.to_le_bytes());
        }
    }
    out
}

/// The programs in a filter file; anything but whole, non-empty programs within the kernel's
/// bound is refused.
pub fn decode(mut bytes: &[u8]) -> Result<Vec<Vec<Insn>>, String> {
    let mut programs = Vec::new();
    while !bytes.is_empty() {
        let (count, rest) = bytes.split_at_checked(4).ok_or("a program's count is cut short")?;
        let n = u32::from_le_bytes(count.try_into().map_err(|_| "a program's count is cut short")?) as usize;
        if n == 0 || n > MAX_PROGRAM {
            return Err(format!("a program of {n} instructions (1 to {MAX_PROGRAM})"));
        }
        let (body, rest) = rest.split_at_checked(n * 8).ok_or("a program is cut short")?;
        programs.push(
            body.chunks_exact(8)
                .map(|c| Insn {
                    code: u16::from_le_bytes([c[0], c[1]]),
                    jt: c[2],
                    jf: c[3],
                    k: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
                })
                .collect(),
        );
        bytes = rest;
    }
    if programs.is_empty() {
        return Err("the filter file holds no program".into());
    }
    Ok(programs)
}

/// Reads the filter at `path` (never through a symlink, bounded) and installs its programs on
/// this process, after `no_new_privs` (which the runtime set already). Returns how many.
pub(crate) fn install_from(path: &Path) -> Result<usize, String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("cannot open the seccomp filter {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read the seccomp filter {}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(format!("the seccomp filter {} is over {MAX_FILE} bytes", path.display()));
    }
    let programs = decode(&bytes).map_err(|why| format!("the seccomp filter {}: {why}", path.display()))?;
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("cannot set no_new_privs: {e}"))?;
    for (i, p) in programs.iter().enumerate() {
        crate::child::raw::install_filter(p)
            .map_err(|e| format!("the kernel refused program {} of the seccomp filter: {e}", i + 1))?;
    }
    Ok(programs.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_round_trip_and_a_cut_or_empty_file_is_refused() {
        let a = vec![Insn { code: 0x20, jt: 0, jf: 0, k: 4 }, Insn { code: 0x06, jt: 1, jf: 2, k: 0x7fff_0000 }];
        let b = vec![Insn { code: 0x06, jt: 0, jf: 0, k: 0x0005_0026 }];
        let bytes = encode(&[a.clone(), b.clone()]);
        assert_eq!(bytes.len(), 4 + 16 + 4 + 8);
        assert_eq!(decode(&bytes).unwrap(), vec![a, b]);
        assert!(decode(&bytes[..bytes.len() - 1]).is_err(), "cut short");
        assert!(decode(&[]).is_err(), "empty");
        assert!(decode(&0u32.to_le_bytes()).is_err(), "a program of nothing");
        assert!(decode(&5000u32.to_le_bytes()).is_err(), "over the kernel's bound");
    }
}
