//! `stevedore image pack`: pack an executable into a FROM scratch worker image.

use super::common::{self, Global};
use crate::handlers::Handlers;
use crate::image::{PackSpec, pack_image};
use std::path::PathBuf;

/// Image commands.
#[derive(Debug, clap::Subcommand)]
pub enum ImageCommand {
    /// Pack an executable (with its loader and libraries when dynamic) into a FROM scratch image
    Pack {
        /// The executable
        #[arg(long, value_name = "PATH")]
        exe: PathBuf,
        /// The image tag
        #[arg(long, value_name = "TAG")]
        tag: String,
        /// Handler-set fingerprint label (default: stevedore's own when packing stevedore)
        #[arg(long, value_name = "FP")]
        fingerprint: Option<String>,
    },
}

/// Runs an image command.
pub async fn image(g: &Global, cmd: ImageCommand, handlers: &Handlers) -> u8 {
    let ImageCommand::Pack { exe, tag, fingerprint } = cmd;
    let rung = match common::rung(g, 1, |_| {}).await {
        Ok(r) => r,
        Err(code) => return code,
    };
    let own = std::env::current_exe().ok().and_then(|p| p.canonicalize().ok());
    let mut spec = PackSpec::new(exe.clone(), tag);
    spec.fingerprint = fingerprint.or_else(|| (exe.canonicalize().ok() == own).then(|| handlers.fingerprint()));
    match pack_image(&rung.engine().docker, &spec).await {
        Ok(img) => {
            println!("{}", serde_json::json!({"image_id": img.id, "tag": img.tag}));
            0
        }
        Err(e) => {
            eprintln!("stevedore: {}", crate::contract::error_chain(&e));
            1
        }
    }
}
