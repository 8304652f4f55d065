//! Every mount destination of an attempt, checked inside the image before its container
//! exists. An engine resolves a destination in the image's root filesystem following
//! symlinks, so an image whose `/out` (or a cache's path, or a parent of either) is a
//! symlink would have its mount land elsewhere: over stevedore's read-only tools (a cache
//! volume holding a planted init would run as PID 1), out of the disk limit's reach, or
//! over the staged inputs. `inspect` after create cannot show it (it reports destinations
//! as written; the symlink is followed at start), so each component of each destination is
//! stat'ed through the archive API on a never-started container of the image (by id) that
//! mounts nothing, once per image and path (images do not change), and a symlink anywhere
//! refuses the attempt. The init checks the same paths again from inside before it starts
//! the command (`wire::Start::mounts`): the only check on engines without an archive API.

use super::site::ContainerSite;
use crate::contract::LaunchError;
use crate::engine::PathKind;
use std::collections::HashMap;
use std::sync::Arc;
use stevedore_init::wire::{IN_DIR, OUT_DIR, TMP_DIR, TOOLS_DIR};

/// Images whose paths are remembered; past it the memory starts afresh.
const MAX_IMAGES: usize = 64;

/// A destination that is not where it was asked to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Redirect {
    /// The component that is a symlink.
    pub path: String,
    /// Where it points, as the engine resolves it.
    pub target: String,
    /// The destination it is part of.
    pub destination: String,
}

impl Redirect {
    /// What the Outcome says.
    pub fn explain(&self, image: &str) -> String {
        let within = if self.path == self.destination {
            String::new()
        } else {
            format!(" (on the way to {})", self.destination)
        };
        format!(
            "image {image} makes {}{within} a symlink to {}: a mount there would land elsewhere (over stevedore's \
             own, or out of a limit's reach), so the attempt was not run",
            self.path, self.target
        )
    }
}

/// Where an attempt mounts something: stevedore's own dirs, the named caches, and the
/// image's `VOLUME`s that are masked.
pub(crate) fn destinations(inputs: bool, caches: &[&str], masked_volumes: &[String]) -> Vec<String> {
    let mut d = vec![TOOLS_DIR.to_owned()];
    if inputs {
        d.push(IN_DIR.to_owned());
    }
    d.extend([OUT_DIR.to_owned(), TMP_DIR.to_owned()]);
    d.extend(caches.iter().map(|c| (*c).to_owned()));
    d.extend(masked_volumes.iter().cloned());
    d
}

/// Every prefix of an absolute path, shortest first (`/a/b` → `/a`, `/a/b`).
fn prefixes(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut at = String::new();
    for c in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
        at.push('/');
        at.push_str(c);
        out.push(at.clone());
    }
    out
}

/// The first redirect among `dests` by what is known of `image_id`; `Err` with the prefixes
/// still to be looked at, in order, when that is not known yet.
fn judge(known: &HashMap<String, PathKind>, dests: &[String]) -> Result<Option<Redirect>, Vec<String>> {
    let mut unknown = Vec::new();
    for d in dests {
        for p in prefixes(d) {
            match known.get(&p) {
                Some(PathKind::Symlink(target)) => {
                    return Ok(Some(Redirect { path: p, target: target.clone(), destination: d.clone() }));
                }
                // Nothing deeper exists: the engine makes it, as a directory.
                Some(PathKind::Missing) => break,
                Some(_) => {}
                None => {
                    if !unknown.contains(&p) {
                        unknown.push(p);
                    }
                    // Deeper components are looked at once this one is known.
                    break;
                }
            }
        }
    }
    if unknown.is_empty() { Ok(None) } else { Err(unknown) }
}

/// Checks `dests` in `image_id`, making a probe container (named `name`, labelled `labels`:
/// the attempt's object while it exists) only for what is not known yet. The probe runs on
/// the rung's tracked tasks, so an attempt dropped meanwhile still removes it.
pub(crate) async fn check(
    shared: &Arc<ContainerSite>,
    image_id: &str,
    name: String,
    labels: HashMap<String, String>,
    dests: &[String],
) -> Result<Option<Redirect>, LaunchError> {
    let known = |shared: &ContainerSite| {
        let seen = shared.mounts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        judge(seen.images.get(image_id).unwrap_or(&HashMap::new()), dests)
    };
    if let Ok(v) = known(shared) {
        return Ok(v);
    }
    if let Some(kept) = remembered(image_id) {
        learn(shared, image_id, kept);
        if let Ok(v) = known(shared) {
            return Ok(v);
        }
    }
    let s = shared.clone();
    let (image, dests) = (image_id.to_owned(), dests.to_vec());
    shared
        .base
        .tracker
        .spawn(async move {
            let api = &s.engine.api;
            api.create_container(&name, super::spec::never_started(&image, "probe", labels, None)).await?;
            let looked = look(&s, &name, &image, &dests).await;
            if let Err(e) = api.remove_container(&name).await {
                tracing::warn!(container = %name, error = %e, "removing the mount probe; reclaim removes it");
            }
            looked
        })
        .await
        .map_err(|e| LaunchError::Staging { what: "the mount check".into(), source: Box::new(e) })?
}

/// Stats what is not known yet on the probe, until every destination is judged.
async fn look(
    shared: &ContainerSite,
    probe: &str,
    image_id: &str,
    dests: &[String],
) -> Result<Option<Redirect>, LaunchError> {
    loop {
        let unknown = {
            let seen = shared.mounts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match judge(seen.images.get(image_id).unwrap_or(&HashMap::new()), dests) {
                Ok(v) => return Ok(v),
                Err(unknown) => unknown,
            }
        };
        let mut found = Vec::with_capacity(unknown.len());
        for p in unknown {
            let kind = shared.engine.api.stat_path(probe, &p).await?;
            found.push((p, kind));
        }
        let all = learn(shared, image_id, found);
        remember(image_id, &all);
    }
}

/// Adds what was found of `image_id`'s paths to what the rung knows; all it knows of them.
fn learn(
    shared: &ContainerSite,
    image_id: &str,
    found: impl IntoIterator<Item = (String, PathKind)>,
) -> HashMap<String, PathKind> {
    let mut seen = shared.mounts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if seen.images.len() >= MAX_IMAGES && !seen.images.contains_key(image_id) {
        seen.images.clear();
    }
    let known = seen.images.entry(image_id.to_owned()).or_default();
    known.extend(found);
    known.clone()
}

/// The file in this user's state dir that keeps what is known of an image's paths: an image
/// id names the image's content, so what was found once holds on every engine and in every
/// later process, which then makes no probe (a create, a stat per component, a removal:
/// 30-50 ms per process here). Only ids of the form `sha256:<64 hex>` are kept.
fn kept_file(image_id: &str) -> Option<(crate::hostdir::PrivateDir, String)> {
    let hex = image_id.strip_prefix("sha256:")?;
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let dir = crate::hostdir::open_default_base().and_then(|b| b.subdir("images"));
    match dir {
        Ok(dir) => Some((dir, hex.to_ascii_lowercase())),
        Err(e) => {
            tracing::debug!(error = %e, "no state dir: an image's paths are probed by every process");
            None
        }
    }
}

/// What an earlier process found of `image_id`'s paths.
fn remembered(image_id: &str) -> Option<HashMap<String, PathKind>> {
    let (dir, name) = kept_file(image_id)?;
    let bytes = dir.read_file(&name, 1 << 20).ok()?;
    let rows: Vec<(String, String, String)> = serde_json::from_slice(&bytes).ok()?;
    rows.into_iter().map(|(path, kind, target)| Some((path, PathKind::from_kept(&kind, target)?))).collect()
}

/// Images whose paths are kept in the state dir; past it the record starts afresh (a CI
/// that builds a new image for every run would otherwise grow it for ever).
const MAX_KEPT: usize = 1024;

/// Keeps what is known of `image_id`'s paths for later processes (best effort).
fn remember(image_id: &str, known: &HashMap<String, PathKind>) {
    let Some((dir, name)) = kept_file(image_id) else { return };
    if let Ok(files) = dir.files()
        && files.len() >= MAX_KEPT
    {
        for f in files.iter().filter(|f| **f != name) {
            let _ = dir.remove_file(f);
        }
    }
    let mut rows: Vec<(&str, &str, &str)> =
        known.iter().map(|(p, k)| (p.as_str(), k.kept_kind(), k.kept_target())).collect();
    rows.sort();
    let Ok(bytes) = serde_json::to_vec(&rows) else { return };
    if let Err(e) = dir.replace_file(&name, &bytes) {
        tracing::debug!(error = %e, "an image's paths were not kept");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is kept of an image's paths comes back as it was, symlink targets with any byte;
    /// an id that is not a sha256 is never a file name.
    #[test]
    fn what_is_kept_of_an_images_paths_comes_back_whole() {
        let kinds = [
            PathKind::Dir,
            PathKind::File,
            PathKind::Other,
            PathKind::Missing,
            PathKind::Symlink("/.stevedore/tools\n\t\"x".into()),
        ];
        for k in kinds {
            assert_eq!(PathKind::from_kept(k.kept_kind(), k.kept_target().to_owned()), Some(k));
        }
        assert_eq!(PathKind::from_kept("socket", String::new()), None);
        for bad in ["busybox:latest", "sha256:../../etc", &format!("sha256:{}", "g".repeat(64))] {
            assert!(kept_file(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn every_component_of_every_destination_is_judged() {
        let dests = destinations(true, &["/var/cache/app/pip"], &["/data".to_owned()]);
        assert_eq!(dests, ["/.stevedore/tools", "/in", "/out", "/tmp", "/var/cache/app/pip", "/data"]);
        assert_eq!(prefixes("/var/cache/app/pip"), ["/var", "/var/cache", "/var/cache/app", "/var/cache/app/pip"]);
        let mut known = HashMap::new();
        // Nothing known: the first component of each is asked for, once.
        assert_eq!(
            judge(&known, &dests),
            Err(vec!["/.stevedore".into(), "/in".into(), "/out".into(), "/tmp".into(), "/var".into(), "/data".into()])
        );
        for p in ["/.stevedore", "/in", "/out", "/tmp", "/var", "/data"] {
            known.insert(p.to_owned(), PathKind::Dir);
        }
        known.insert("/.stevedore/tools".into(), PathKind::Missing);
        known.insert("/var/cache".into(), PathKind::Dir);
        assert_eq!(judge(&known, &dests), Err(vec!["/var/cache/app".into()]));
        known.insert("/var/cache/app".into(), PathKind::Symlink("/.stevedore/tools".into()));
        let r = judge(&known, &dests).unwrap().unwrap();
        assert_eq!((r.path.as_str(), r.target.as_str()), ("/var/cache/app", "/.stevedore/tools"));
        assert!(r.explain("img:1").contains("/var/cache/app (on the way to /var/cache/app/pip) a symlink"));
        known.insert("/var/cache/app".into(), PathKind::Dir);
        known.insert("/var/cache/app/pip".into(), PathKind::Missing);
        assert_eq!(judge(&known, &dests), Ok(None));
        known.insert("/out".into(), PathKind::Symlink("/tmp".into()));
        assert_eq!(judge(&known, &dests).unwrap().unwrap().path, "/out");
    }
}
