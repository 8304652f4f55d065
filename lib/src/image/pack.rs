//! Packs an executable (with its loader and libraries when dynamic) into a `FROM scratch`
//! image through the Engine API, from in-memory tars: nothing is pulled and nothing on the
//! engine host's filesystem is needed, so it works on a remote engine too.
//!
//! Packing imports a root filesystem tar with `USER`/`ENTRYPOINT`/`LABEL` changes
//! (`POST /images/create?fromSrc=-`) rather than building a Dockerfile: the legacy builder
//! commits an intermediate container for every metadata instruction and every label
//! (≈ 1 s each on the reference machine, ≈ 7 s per pack), where the import takes ≈ 0.1 s
//! and gives the same one-layer image. Arbitrary Dockerfiles still go through
//! [`build_image_from_dir_tar`].

use super::bundle::{BundleError, ExeBundle};
use super::tarball::{append_bytes, append_dir};
use crate::engine::{Built, Engine, EngineError, ImageInfo};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Label: stevedore manages this object.
pub const LABEL_MANAGED: &str = "dev.stevedore.managed";
/// Label: the fingerprint of the handler set inside the image.
pub const LABEL_FINGERPRINT: &str = "dev.stevedore.fingerprint";
/// Label: the argv prefix (a JSON array) that execs the packed binary inside the image.
pub const LABEL_ENTRY: &str = "dev.stevedore.entry";
/// Label: the image was packed by stevedore from a host executable.
pub const LABEL_PACKED: &str = "dev.stevedore.packed";
/// Label: the sha256 of the packed executable.
pub const LABEL_EXE_SHA256: &str = "dev.stevedore.exe_sha256";

/// Where the packed executable and its libraries live inside the image.
pub const APP_DIR: &str = "/app";
/// The default non-root user (and group) of a packed image: the sandbox's.
pub const DEFAULT_USER: (u32, u32) = (stevedore_init::wire::SANDBOX_UID, stevedore_init::wire::SANDBOX_UID);
/// The name the passwd and group files give the non-root user.
pub const USER_NAME: &str = "stevedore";

/// Why an image could not be packed or built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PackError {
    /// the executable could not be bundled
    #[error("cannot bundle the executable")]
    Tools(#[from] BundleError),
    /// the build context could not be written
    #[error("cannot write the build context")]
    Context(#[source] std::io::Error),
    /// an engine call failed
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// the build itself failed (a Dockerfile step, a missing file, ...)
    #[error("image build of {tag} failed: {message}")]
    Build {
        /// The tag being built.
        tag: String,
        /// The builder's message.
        message: String,
    },
    /// a label cannot be set on an image
    #[error("label {key:?} has a key or value that cannot be set")]
    BadLabel {
        /// The label's key.
        key: String,
    },
    /// a root filesystem directory could not be written
    #[error("cannot write the root filesystem at {path}")]
    Rootfs {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// the root filesystem directory already has files in it
    #[error("{path} exists and is not empty: give a new or empty directory")]
    RootfsNotEmpty {
        /// The directory.
        path: PathBuf,
    },
    /// the host-wide lock that keeps two processes from packing the same tag at once failed
    #[error("cannot lock {path}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// the build finished without naming an image
    #[error("image build of {tag} produced no image id")]
    NoImageId {
        /// The tag being built.
        tag: String,
    },
}

/// What to pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackSpec {
    /// The host executable.
    pub exe: PathBuf,
    /// The image tag to give the result (e.g. `stevedore-worker:latest`).
    pub tag: String,
    /// The handler-set fingerprint to label the image with, if any.
    pub fingerprint: Option<String>,
    /// Extra image labels (cannot override stevedore's own).
    pub labels: BTreeMap<String, String>,
    /// The uid and gid the image runs as.
    pub user: (u32, u32),
}

impl PackSpec {
    /// A spec with no fingerprint, no extra labels and the default non-root user.
    pub fn new(exe: impl Into<PathBuf>, tag: impl Into<String>) -> Self {
        PackSpec { exe: exe.into(), tag: tag.into(), fingerprint: None, labels: BTreeMap::new(), user: DEFAULT_USER }
    }
}

/// A packed image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedImage {
    /// The image id (`sha256:...`).
    pub id: String,
    /// The tag it carries.
    pub tag: String,
    /// The argv prefix that execs the packed binary inside the image.
    pub entry: Vec<String>,
    /// True when an existing image was reused instead of built.
    pub reused: bool,
    /// The bundle this pack added to the host's cache, if it made one (`bundle`'s doc).
    pub bundle_added: Option<super::bundle::BundleAdded>,
}

fn labels_for(spec: &PackSpec, bundle: &ExeBundle, entry: &[String]) -> BTreeMap<String, String> {
    let mut labels = spec.labels.clone();
    let mut own = |k: &str, v: String| {
        labels.insert(k.to_owned(), v);
    };
    own(LABEL_MANAGED, "true".to_owned());
    own(LABEL_PACKED, "true".to_owned());
    own(LABEL_ENTRY, serde_json::to_string(entry).expect("strings always serialise"));
    own(LABEL_EXE_SHA256, bundle.exe_sha256().to_owned());
    if let Some(fp) = &spec.fingerprint {
        own(LABEL_FINGERPRINT, fp.clone());
    }
    labels
}

fn user_string(user: (u32, u32)) -> String {
    format!("{}:{}", user.0, user.1)
}

fn passwd_and_group(user: (u32, u32)) -> (String, String) {
    let (uid, gid) = user;
    let mut passwd = "root:x:0:0:root:/:/sbin/nologin\n".to_owned();
    let mut group = "root:x:0:\n".to_owned();
    if uid != 0 {
        passwd.push_str(&format!("{USER_NAME}:x:{uid}:{gid}:{USER_NAME}:/nonexistent:/sbin/nologin\n"));
    }
    if gid != 0 {
        group.push_str(&format!("{USER_NAME}:x:{gid}:\n"));
    }
    (passwd, group)
}

/// The image's root filesystem: the bundle under [`APP_DIR`] and the user's passwd/group.
fn rootfs_tar(spec: &PackSpec, bundle: &ExeBundle) -> Result<Vec<u8>, PackError> {
    write_rootfs_tar(spec.user, bundle, Vec::new(), |_| {})
}

/// The image's root filesystem as a tar into `out`: the bundle under [`APP_DIR`], and the
/// user's `passwd` and `group`. On an error `on_error` gets `out` first, before the builder
/// is dropped (its drop writes the archive's end marker: a streamed body must not end as if
/// whole).
fn write_rootfs_tar<W: std::io::Write>(
    user: (u32, u32),
    bundle: &ExeBundle,
    out: W,
    on_error: impl FnOnce(&mut W),
) -> Result<W, PackError> {
    let (passwd, group) = passwd_and_group(user);
    let mut tar = tar::Builder::new(out);
    let written =
        bundle.append_to_tar(&mut tar, APP_DIR.trim_start_matches('/')).map_err(PackError::from).and_then(|()| {
            (|| {
                append_dir(&mut tar, "etc/")?;
                append_bytes(&mut tar, "etc/passwd", 0o644, passwd.as_bytes())?;
                append_bytes(&mut tar, "etc/group", 0o644, group.as_bytes())
            })()
            .map_err(PackError::Context)
        });
    if let Err(e) = written {
        on_error(tar.get_mut());
        return Err(e);
    }
    tar.into_inner().map_err(PackError::Context)
}

/// The Dockerfile instructions the import applies: user, entrypoint, labels.
fn changes(spec: &PackSpec, entry: &[String], labels: &BTreeMap<String, String>) -> Result<Vec<String>, PackError> {
    let mut label = String::from("LABEL");
    for (k, v) in labels {
        let key_ok =
            !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/'));
        if !key_ok || v.chars().any(char::is_control) {
            return Err(PackError::BadLabel { key: k.clone() });
        }
        // Inside double quotes the instruction parser unescapes \\, \" and \$ (and would
        // otherwise expand $VAR), so these three are the ones to escape.
        let mut quoted = String::with_capacity(v.len() + 2);
        for c in v.chars() {
            if matches!(c, '\\' | '"' | '$') {
                quoted.push('\\');
            }
            quoted.push(c);
        }
        label.push_str(&format!(" {k}=\"{quoted}\""));
    }
    Ok(vec![
        format!("USER {}", user_string(spec.user)),
        format!("ENTRYPOINT {}", serde_json::to_string(entry).expect("strings always serialise")),
        label,
    ])
}

/// What [`write_rootfs`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rootfs {
    /// The argv that execs the executable in an image made from the directory.
    pub entry: Vec<String>,
    /// Files written, relative to the directory.
    pub files: Vec<String>,
}

/// Writes a root filesystem for a `FROM scratch` Dockerfile (`COPY rootfs/ /`) into `dir`,
/// which must be absent or empty: the executable at `/app/NAME`, and for a dynamic one its
/// loader and libraries at the paths where the host has them, so that `/app/NAME` runs
/// directly (a Dockerfile cannot take its `ENTRYPOINT` from a build argument, so the
/// entry must not depend on how the executable is linked); plus `/etc/passwd` and
/// `/etc/group` naming `user`. Needs no engine.
pub fn write_rootfs(exe: &Path, dir: &Path, user: (u32, u32)) -> Result<Rootfs, PackError> {
    use std::os::unix::fs::PermissionsExt;
    let name = exe
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| PackError::Rootfs { path: exe.to_owned(), source: std::io::Error::other("no UTF-8 file name") })?
        .to_owned();
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(PackError::RootfsNotEmpty { path: dir.to_owned() });
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(PackError::Rootfs { path: dir.to_owned(), source }),
    }
    let linkage = super::bundle::host_linkage(exe)?;
    let mut files = Vec::new();
    let mut put = |from: Option<&Path>, rel: &str, mode: u32, body: &[u8]| -> Result<(), PackError> {
        let to = dir.join(rel);
        let err = |source| PackError::Rootfs { path: to.clone(), source };
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(err)?;
            std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).map_err(err)?;
        }
        match from {
            // fs::copy follows a host symlink (libc.so.6 -> libc-2.36.so), so the image holds the file.
            Some(from) => std::fs::copy(from, &to).map(drop).map_err(err)?,
            None => std::fs::write(&to, body).map_err(err)?,
        }
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode)).map_err(err)?;
        files.push(rel.to_owned());
        Ok(())
    };
    std::fs::create_dir_all(dir).map_err(|source| PackError::Rootfs { path: dir.to_owned(), source })?;
    put(Some(exe), &format!("{}/{name}", APP_DIR.trim_start_matches('/')), 0o755, b"")?;
    if let Some((loader, libs)) = &linkage {
        let rel = |p: &Path| p.to_string_lossy().trim_start_matches('/').to_owned();
        put(Some(loader), &rel(loader), 0o755, b"")?;
        for lib in libs {
            put(Some(lib), &rel(lib), 0o644, b"")?;
        }
    }
    let (passwd, group) = passwd_and_group(user);
    put(None, "etc/passwd", 0o644, passwd.as_bytes())?;
    put(None, "etc/group", 0o644, group.as_bytes())?;
    Ok(Rootfs { entry: vec![format!("{APP_DIR}/{name}")], files })
}

/// Splits `name:tag` (a `:` in a registry host's port is not a tag).
/// Packs `spec.exe` into a `FROM scratch` image tagged `spec.tag`, always building. The
/// image the tag pointed to before is removed when that left it without a tag and unused
/// (see [`ensure_image`]).
pub async fn pack_image(engine: &Engine, spec: &PackSpec) -> Result<PackedImage, PackError> {
    let bundle = ExeBundle::prepare_default(&spec.exe)?;
    // Two packs of one tag at once would each leave the other's image dangling.
    let _lock = lock_tag(&spec.tag).await?;
    let previous = engine.api.image_info(&spec.tag).await?.map(|image| image.id);
    pack_bundle(engine, spec, &bundle, previous).await
}

/// Packs the bundle as `spec.tag`; `previous` is the image the tag pointed to before.
async fn pack_bundle(
    engine: &Engine,
    spec: &PackSpec,
    bundle: &ExeBundle,
    previous: Option<String>,
) -> Result<PackedImage, PackError> {
    let entry = bundle.argv(APP_DIR);
    let labels = labels_for(spec, bundle, &entry);
    let changes = changes(spec, &entry, &labels)?;
    let id = import(engine, spec, bundle, changes).await?;
    if let Some(old) = previous.filter(|old| *old != id) {
        let fate = remove_replaced(engine, &old).await;
        tracing::debug!(tag = %spec.tag, image = %old, ?fate, "the image the tag replaced");
    }
    Ok(PackedImage { id, tag: spec.tag.clone(), entry, reused: false, bundle_added: bundle.added().cloned() })
}

/// What became of the image a tag pointed to before the tag was packed again.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Replaced {
    /// Removed (with its untagged parents).
    Removed,
    /// Kept: it still has another tag.
    Tagged,
    /// Kept: the engine refused (a container, running or not, was made from it, or an
    /// image is built on it).
    InUse(String),
    /// Already gone.
    Gone,
    /// Kept: the engine failed.
    Failed(String),
}

/// Removes the image `id` that a tag pointed to before it was packed again, when that left
/// it without a tag: never forced (an image a container uses stays) and never an image
/// with another tag (removing by id would untag it).
async fn remove_replaced(engine: &Engine, id: &str) -> Replaced {
    match engine.api.image_info(id).await {
        Ok(None) => return Replaced::Gone,
        Ok(Some(image)) if !image.tags.is_empty() => return Replaced::Tagged,
        Ok(Some(_)) => {}
        Err(e) => return Replaced::Failed(crate::util::error_chain(&e)),
    }
    match engine.api.remove_image(id).await {
        Ok(()) => Replaced::Removed,
        Err(e) if e.is_not_found() => Replaced::Gone,
        Err(e) if e.is_conflict() => Replaced::InUse(e.message()),
        Err(e) => Replaced::Failed(crate::util::error_chain(&e)),
    }
}

/// Reuses `spec.tag` when it already holds this exe packed the same way, else packs it.
/// The image the tag pointed to before is then removed, when that left it without a tag
/// and no container uses it (an image with another tag, or one a container was made from,
/// stays).
///
/// Processes on one host that ensure (or pack) the same tag at once (eight `stevedore run
/// --handler` on first use) take turns on a lock file: the first packs, the others reuse
/// its image, and no untagged duplicate is left behind.
pub async fn ensure_image(engine: &Engine, spec: &PackSpec) -> Result<PackedImage, PackError> {
    let _lock = lock_tag(&spec.tag).await?;
    let bundle = ExeBundle::prepare_default(&spec.exe)?;
    let entry = bundle.argv(APP_DIR);
    let wanted = labels_for(spec, &bundle, &entry);
    let mut previous = None;
    if let Some(ImageInfo { id, labels: have, user, .. }) = engine.api.image_info(&spec.tag).await? {
        let same_labels = wanted.iter().all(|(k, v)| have.get(k) == Some(v))
            // A fingerprint dropped from the spec must not survive on the image.
            && (spec.fingerprint.is_some() || !have.contains_key(LABEL_FINGERPRINT));
        let same_user = user.as_deref() == Some(user_string(spec.user).as_str());
        if same_labels && same_user && !id.is_empty() {
            return Ok(PackedImage {
                id,
                tag: spec.tag.clone(),
                entry,
                reused: true,
                bundle_added: bundle.added().cloned(),
            });
        }
        previous = Some(id).filter(|i| !i.is_empty());
    }
    pack_bundle(engine, spec, &bundle, previous).await
}

/// Takes the host-wide lock for `tag` (released when the returned file is dropped).
async fn lock_tag(tag: &str) -> Result<nix::fcntl::Flock<std::fs::File>, PackError> {
    use sha2::Digest;
    let base = crate::hostdir::default_base();
    let name = format!("pack-{:x}.lock", sha2::Sha256::digest(tag.as_bytes()));
    let path = base.join("locks").join(&name);
    let err = |path: &Path, source| PackError::Lock { path: path.to_owned(), source };
    let file = crate::hostdir::PrivateDir::open(&base)
        .and_then(|b| b.subdir("locks"))
        .and_then(|d| d.open_file(&name))
        .map_err(|e| err(&path, std::io::Error::other(e)))?;
    // flock blocks: wait for it off the async workers.
    let p = path.clone();
    tokio::task::spawn_blocking(move || nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive))
        .await
        .map_err(|e| err(&p, std::io::Error::other(e)))?
        .map_err(|(_, errno)| err(&path, errno.into()))
}

/// Imports a root filesystem tar as a one-layer image with `changes` applied.
async fn import(
    engine: &Engine,
    spec: &PackSpec,
    bundle: &ExeBundle,
    changes: Vec<String>,
) -> Result<String, PackError> {
    let reference = spec.tag.as_str();
    if engine.facts().is_podman() {
        // Podman's compat import takes the newline-joined `changes` (how bollard sends them)
        // as one instruction; its builder is fast, so the same image is built instead.
        return import_by_build(engine, reference, rootfs_tar(spec, bundle)?, &changes).await;
    }
    // Streamed as it is written: a debug build's binary is ~170 MB, never held whole here.
    let (writer, chunks) = crate::pipe::writer(8);
    let (user, for_tar) = (spec.user, bundle.clone());
    let producer = tokio::task::spawn_blocking(move || {
        let mut whole = Whole(Some(writer));
        write_rootfs_tar(user, &for_tar, &mut whole, |w| w.poison())?;
        // Whole: its last chunk goes, and the body ends as a body should.
        if let Some(mut w) = whole.0.take() {
            std::io::Write::flush(&mut w).map_err(PackError::Context)?;
        }
        Ok::<(), PackError>(())
    });
    let built = engine.api.import_image(reference, Box::pin(chunks), changes).await;
    let written = producer.await.map_err(|e| PackError::Context(std::io::Error::other(e)))?;
    match written {
        // The engine stopped reading: its answer says why.
        Err(PackError::Context(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        // The tar could not be written: that is the cause (the body was failed, not ended).
        Err(e) => return Err(e),
        Ok(()) => {}
    }
    made(engine, reference, built?).await
}

/// The import's body writer: dropped before the tar was whole (an error), it fails the
/// request instead of ending the body early.
struct Whole(Option<crate::pipe::ChannelWriter>);

impl std::io::Write for Whole {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.as_mut().map_or(Ok(0), |w| w.write(data))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.as_mut().map_or(Ok(()), std::io::Write::flush)
    }
}

impl Whole {
    /// Fails the body now; what is written after is dropped.
    fn poison(&mut self) {
        if let Some(w) = self.0.take() {
            w.abort(std::io::Error::other("the image's root filesystem could not be written whole"));
        }
    }
}

impl Drop for Whole {
    fn drop(&mut self) {
        self.poison();
    }
}

/// The same image as `import`: `FROM scratch`, the rootfs added, the changes applied.
async fn import_by_build(
    engine: &Engine,
    reference: &str,
    rootfs: Vec<u8>,
    changes: &[String],
) -> Result<String, PackError> {
    let dockerfile = format!("FROM scratch\nADD rootfs.tar /\n{}\n", changes.join("\n"));
    let mut context = tar::Builder::new(Vec::new());
    append_bytes(&mut context, "Dockerfile", 0o644, dockerfile.as_bytes()).map_err(PackError::Context)?;
    append_bytes(&mut context, "rootfs.tar", 0o644, &rootfs).map_err(PackError::Context)?;
    build_image_from_dir_tar(engine, reference, context.into_inner().map_err(PackError::Context)?).await
}

/// Builds any Dockerfile context (a tar with `Dockerfile` at its root) into `tag` with the
/// engine's legacy builder; returns the image id.
pub async fn build_image_from_dir_tar(engine: &Engine, tag: &str, context_tar: Vec<u8>) -> Result<String, PackError> {
    let built = engine.api.build_image(tag, context_tar).await?;
    made(engine, tag, built).await
}

/// The id of the image a build or import made as `tag`.
async fn made(engine: &Engine, tag: &str, built: Built) -> Result<String, PackError> {
    match built {
        Built::Failed(message) => Err(PackError::Build { tag: tag.to_owned(), message }),
        Built::Made(Some(id)) => Ok(id),
        // An engine that streams no id still tagged the result.
        Built::Made(None) => match engine.api.image_info(tag).await? {
            Some(image) if !image.id.is_empty() => Ok(image.id),
            Some(_) => Err(PackError::NoImageId { tag: tag.to_owned() }),
            None => Err(PackError::Build { tag: tag.to_owned(), message: "the build made no image".into() }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_has_dockerfile_user_and_entry() {
        let exe = std::env::current_exe().unwrap();
        let base = tempfile::tempdir().unwrap();
        let bundle = ExeBundle::prepare(&exe, base.path()).unwrap();
        let mut spec = PackSpec::new(&exe, "t:latest");
        spec.fingerprint = Some("fp1".to_owned());
        spec.labels.insert("x".to_owned(), "y".to_owned());
        spec.labels.insert(LABEL_MANAGED.to_owned(), "false".to_owned());
        let entry = bundle.argv(APP_DIR);
        assert_eq!(entry[0], format!("/app/lib/{}", bundle.loader().unwrap()));
        let labels = labels_for(&spec, &bundle, &entry);
        assert_eq!(labels[LABEL_MANAGED], "true");
        assert_eq!(labels[LABEL_FINGERPRINT], "fp1");
        assert_eq!(labels["x"], "y");
        let parsed: Vec<String> = serde_json::from_str(&labels[LABEL_ENTRY]).unwrap();
        assert_eq!(parsed, entry);

        let changes = changes(&spec, &entry, &labels).unwrap();
        assert_eq!(changes[0], "USER 65532:65532");
        assert_eq!(changes[1], format!("ENTRYPOINT {}", labels[LABEL_ENTRY]));
        assert!(changes[2].contains(r#" dev.stevedore.entry="[\"/app/lib/ld-linux"#));
        assert!(changes[2].contains(r#" x="y""#));

        let tar = rootfs_tar(&spec, &bundle).unwrap();
        let mut archive = tar::Archive::new(tar.as_slice());
        let mut files = BTreeMap::new();
        for e in archive.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().to_string_lossy().into_owned();
            let mut body = String::new();
            if path.starts_with("etc/") && !path.ends_with('/') {
                std::io::Read::read_to_string(&mut e, &mut body).unwrap();
            }
            files.insert(path, body);
        }
        assert!(files["etc/passwd"].contains("stevedore:x:65532:65532:"));
        assert!(files["etc/group"].contains("stevedore:x:65532:"));
        assert!(files.contains_key(&format!("app/{}", bundle.exe_name())));
        assert!(files.contains_key("app/lib/"));
    }

    #[test]
    fn label_values_are_escaped_and_bad_keys_refused() {
        let mut spec = PackSpec::new("/x", "t");
        let labels = BTreeMap::from([("k".to_owned(), r#"a "b" \ $HOME"#.to_owned())]);
        let changes = changes(&spec, &[], &labels).unwrap();
        assert_eq!(changes[2], r#"LABEL k="a \"b\" \\ \$HOME""#);
        for (k, v) in [("a b", "v"), ("", "v"), ("k", "line\nbreak")] {
            let labels = BTreeMap::from([(k.to_owned(), v.to_owned())]);
            assert!(matches!(changes_of(&spec, &labels), Err(PackError::BadLabel { .. })));
        }
        spec.user = (0, 0);
        assert_eq!(changes_of(&spec, &BTreeMap::new()).unwrap()[0], "USER 0:0");
    }

    fn changes_of(spec: &PackSpec, labels: &BTreeMap<String, String>) -> Result<Vec<String>, PackError> {
        changes(spec, &[], labels)
    }
}
