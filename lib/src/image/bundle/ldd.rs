//! What a dynamic executable needs on the host: its loader and libraries, as `ldd` lists
//! them (parsed strictly; a library not found is an error, never a broken bundle).

use super::*;

/// What `ldd` says about an executable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Linkage {
    Static,
    Dynamic {
        /// Where the loader is on the host.
        loader: PathBuf,
        /// soname → resolved host path.
        libs: BTreeMap<String, PathBuf>,
    },
}

/// Where a dynamic executable's loader and libraries are on the host, as `ldd` resolves
/// them: `None` for a static executable, else (loader path, library paths).
pub fn host_linkage(exe: &Path) -> Result<Option<(PathBuf, Vec<PathBuf>)>, BundleError> {
    Ok(match run_ldd(exe)? {
        Linkage::Static => None,
        Linkage::Dynamic { loader, libs } => Some((loader, libs.into_values().collect())),
    })
}

pub(super) fn run_ldd(exe: &Path) -> Result<Linkage, BundleError> {
    let out = Command::new("ldd")
        .arg(exe)
        // ldd prints in the C locale's words, which the parser depends on.
        .env("LC_ALL", "C")
        .output()
        .map_err(|source| BundleError::LddSpawn { path: exe.to_owned(), source })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    parse_ldd(exe, out.status.success(), &stdout, &stderr)
}

pub(super) fn parse_ldd(exe: &Path, success: bool, stdout: &str, stderr: &str) -> Result<Linkage, BundleError> {
    let all = format!("{stdout}\n{stderr}");
    if all.contains("not a dynamic executable") || all.contains("statically linked") {
        return Ok(Linkage::Static);
    }
    let fail = |message: String| BundleError::Ldd { path: exe.to_owned(), message };
    if !success {
        return Err(fail(stderr.trim().to_owned()));
    }
    let mut loader = None;
    let mut libs = BTreeMap::new();
    for line in stdout.lines().map(str::trim).filter(|l| !l.is_empty()) {
        // Strip the load address: "name => path (0x...)" or "path (0x...)".
        let line = match line.rfind(" (0x") {
            Some(i) => &line[..i],
            None => line,
        };
        if let Some((name, path)) = line.split_once("=>") {
            let (name, path) = (name.trim(), path.trim());
            if path == "not found" || path.is_empty() {
                return Err(BundleError::MissingLibrary { path: exe.to_owned(), name: name.to_owned() });
            }
            if !path.starts_with('/') {
                return Err(fail(format!("unexpected line {line:?}")));
            }
            libs.insert(name.to_owned(), PathBuf::from(path));
        } else if line.starts_with('/') {
            loader = Some(PathBuf::from(line));
        } else if line.starts_with("linux-vdso") || line.starts_with("linux-gate") {
            // The vDSO is provided by the kernel, not a file.
        } else {
            return Err(fail(format!("unexpected line {line:?}")));
        }
    }
    let loader = loader.ok_or_else(|| fail("no loader listed".to_owned()))?;
    // Some libraries list the loader by soname too; it is stored once, as the loader.
    if let Some(name) = loader.file_name().and_then(|n| n.to_str()) {
        libs.remove(name);
    }
    Ok(Linkage::Dynamic { loader, libs })
}
