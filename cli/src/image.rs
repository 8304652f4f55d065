//! `stevedore image`: make worker images (pack an executable, or prepare a Dockerfile's rootfs).

use crate::common::{self, Global};
use crate::error::CliError;
use std::path::{Path, PathBuf};
use stevedore::handlers::Handlers;
use stevedore::image::{PackSpec, pack_image, write_rootfs};

/// Image commands.
#[derive(Debug, clap::Subcommand)]
pub enum ImageCommand {
    /// Pack an executable (with its loader and libraries when dynamic) into a FROM scratch image
    #[command(
        after_help = "Examples:\n  stevedore image pack --exe target/release/stevedore --tag stevedore-worker:dev\n  \
                            stevedore image pack --exe ./my-worker --tag my-worker:1 --fingerprint sha256:..."
    )]
    Pack {
        /// The executable to pack
        #[arg(long, value_name = "PATH")]
        exe: PathBuf,
        /// Name and tag of the image, e.g. my-worker:dev
        #[arg(long, short = 't', value_name = "TAG")]
        tag: String,
        /// Handler-set fingerprint label (default: stevedore's own when packing stevedore)
        #[arg(long, value_name = "FP")]
        fingerprint: Option<String>,
    },
    /// Write a root filesystem (and DIR.args, its build args) for the top-level Dockerfile
    #[command(after_help = "Example (see the Dockerfile):\n  \
                            stevedore image rootfs --exe target/release/stevedore --dir target/worker-rootfs\n  \
                            docker build -t stevedore-worker:latest $(cat target/worker-rootfs.args) .")]
    Rootfs {
        /// The executable (its loader and libraries come along when it is dynamic)
        #[arg(long, value_name = "PATH")]
        exe: PathBuf,
        /// Directory to write, absent or empty
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// Handler-set fingerprint (default: stevedore's own when it is stevedore)
        #[arg(long, value_name = "FP")]
        fingerprint: Option<String>,
    },
    /// Make stevedore's init image (FROM scratch + the static init), which the kube rung's
    /// Pods copy the init from; push it where the cluster pulls from
    #[command(after_help = "Examples:\n  stevedore image init\n  \
                            stevedore image init --tag registry.example.com/stevedore-init:1 && \
                            docker push registry.example.com/stevedore-init:1\n  \
                            stevedore run --rung kube --init-image registry.example.com/stevedore-init:1 ...\n\n\
                            Prints {\"image_id\", \"tag\", \"reused\"}. Without --tag the tag is the one --rung kube \
                            uses by default.")]
    Init {
        /// Name and tag of the image (default: stevedore-init:<first 16 hex of the init's sha256>)
        #[arg(long, short = 't', value_name = "TAG")]
        tag: Option<String>,
    },
}

fn is_own(exe: &Path) -> bool {
    let own = std::env::current_exe().ok().and_then(|p| p.canonicalize().ok());
    own.is_some() && exe.canonicalize().ok() == own
}

/// Runs an image command: 0 on success, 1 on failure (with the reason on stderr).
pub async fn image(g: &Global, cmd: ImageCommand, handlers: &Handlers) -> u8 {
    match cmd {
        ImageCommand::Pack { exe, tag, fingerprint } => {
            let rung = match common::engine(g).await {
                Ok(r) => r,
                Err(e) => return e.said(),
            };
            let mut spec = PackSpec::new(exe.clone(), tag);
            spec.fingerprint = fingerprint.or_else(|| is_own(&exe).then(|| handlers.fingerprint()));
            let packing = crate::progress::spinner(&format!("packing {}", spec.tag), false);
            let packed = pack_image(rung.engine(), &spec).await;
            drop(packing);
            match packed {
                Ok(img) => {
                    if let Some(added) = &img.bundle_added {
                        crate::say::say(common::bundle_added(added));
                    }
                    println!("{}", serde_json::json!({"image_id": img.id, "tag": img.tag}));
                    0
                }
                Err(e) => CliError::Failed(stevedore::error_chain(&e)).said(),
            }
        }
        ImageCommand::Init { tag } => {
            let rung = match common::engine(g).await {
                Ok(r) => r,
                Err(e) => return e.said(),
            };
            let tag = tag.unwrap_or_else(stevedore::kube::default_init_image);
            match stevedore::image::pack_init_image(rung.engine(), &tag).await {
                Ok((id, reused)) => {
                    println!("{}", serde_json::json!({"image_id": id, "tag": tag, "reused": reused}));
                    0
                }
                Err(e) => CliError::Failed(stevedore::error_chain(&e)).said(),
            }
        }
        ImageCommand::Rootfs { exe, dir, fingerprint } => {
            let fingerprint = fingerprint.or_else(|| is_own(&exe).then(|| handlers.fingerprint()));
            let rootfs = match write_rootfs(&exe, &dir, stevedore::image::pack::DEFAULT_USER) {
                Ok(r) => r,
                Err(e) => {
                    return CliError::Failed(stevedore::error_chain(&e)).said();
                }
            };
            // Shell-safe words (a fingerprint is `sha256:` and hex), for `$(cat FILE)`.
            let args = fingerprint.as_ref().map(|fp| format!("--build-arg FINGERPRINT={fp}\n")).unwrap_or_default();
            let args_file = dir.with_extension("args");
            if let Err(e) = std::fs::write(&args_file, args) {
                return CliError::Failed(format!("cannot write {}: {e}", args_file.display())).said();
            }
            let line = serde_json::json!({
                "dir": dir, "entry": rootfs.entry, "files": rootfs.files.len(),
                "fingerprint": fingerprint, "build_args": args_file,
            });
            println!("{line}");
            0
        }
    }
}
