//! Inputs over the link, the host's half (`docs/link.md`, "Inputs over the link"; the init's is
//! `init/src/stage.rs`): before the Start frame, a `Stage` frame, the inputs tar written by
//! descriptor as `Inputs` frames, their end; then the init's answer, read outside the
//! numbering and compared with what was sent (counts and the input tree digest). A rung
//! decides where this path is fit; this module names no rung.

use super::session::{Inbound, Transport};
use crate::contract::{InputsStaged, LaunchError};
use crate::inputs::{InputDir, Owners};
use futures_util::StreamExt;
use std::time::Duration;
use stevedore_init::wire::{self, Decoder, InputsSent, Kind, MAX_CHUNK, StageSpec, Staged};

/// The most entries the link takes: past it, the inputs go another way (the init keeps a
/// line per entry while it writes them, for the tree digest).
pub(crate) const LINK_MAX_ENTRIES: u64 = 100_000;

/// Why the inputs did not go over the link.
#[derive(Debug)]
pub(crate) enum NotStaged {
    /// The init refused: the sandbox was not what it must be (another process in it, the
    /// staging mount not root's alone or not empty); nothing of the inputs was written.
    Refused(String),
    /// The link or the inputs failed.
    Failed(LaunchError),
}

impl From<LaunchError> for NotStaged {
    fn from(e: LaunchError) -> Self {
        NotStaged::Failed(e)
    }
}

/// Where the init writes the inputs: the staging mount, writable, and the same volume
/// read-only at `in_dir`; `tighten`: the mount's root may be made with group and other
/// write bits, which the init clears (`wire::StageSpec::tighten`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Staging<'a> {
    pub stage_dir: &'a str,
    pub in_dir: &'a str,
    pub tighten: bool,
}

/// Asks the init on `transport` to check its sandbox (`at`) and, with `inputs`, to write
/// them; within `within`. What was staged, as the other paths say it.
pub(crate) async fn over_link(
    transport: &mut Transport,
    at: Staging<'_>,
    inputs: Option<(&InputDir, &InputsStaged)>,
    limit: u64,
    within: Duration,
    progress: Option<crate::contract::ProgressSink>,
) -> Result<Option<InputsStaged>, NotStaged> {
    let (inbound, sender) = transport;
    let sent = inputs.as_ref().map(|_| InputsSent { max_entries: LINK_MAX_ENTRIES, max_bytes: limit });
    let spec = StageSpec {
        stage_dir: at.stage_dir.to_owned(),
        in_dir: at.in_dir.to_owned(),
        inputs: sent,
        tighten: at.tighten,
    };
    let link = |e: std::io::Error| LaunchError::staging("the inputs over the link", e);
    let exchange = async {
        sender.frame(Kind::Stage, &serde_json::to_vec(&spec).expect("a spec always serialises")).await.map_err(link)?;
        let report = match inputs {
            Some((dir, staged)) => {
                let dir = dir.try_clone().map_err(|e| LaunchError::staging("the input dir", e))?;
                let (producer, chunks) =
                    crate::inputs::tar_stream(dir, Owners::RootReadOnly, limit, staged.bytes, progress.clone());
                let mut chunks = std::pin::pin!(chunks);
                while let Some(chunk) = chunks.next().await {
                    let chunk = chunk.map_err(link)?;
                    for frame in chunk.chunks(MAX_CHUNK) {
                        sender.frame(Kind::Inputs, frame).await.map_err(link)?;
                    }
                }
                sender.frame(Kind::InputsEnd, b"").await.map_err(link)?;
                let report = crate::inputs::finish(producer, staged.bytes, progress.as_ref()).await?;
                Some((staged, report))
            }
            None => None,
        };
        let answer = answer(inbound).await?;
        Ok::<_, NotStaged>((report, answer))
    };
    let (report, answer) = tokio::time::timeout(within, exchange).await.map_err(|_| {
        NotStaged::Failed(LaunchError::staging(
            "the inputs over the link",
            std::io::Error::other(format!("no answer from the init within {within:?}")),
        ))
    })??;
    if let Some(why) = answer.refused {
        return Err(NotStaged::Refused(why));
    }
    let Some((staged, report)) = report else { return Ok(None) };
    let written = (answer.entries, answer.files, answer.bytes, answer.tree.as_deref());
    let sent = (report.entries, report.files, report.bytes, Some(report.tree.as_str()));
    if written != sent {
        return Err(NotStaged::Failed(LaunchError::staging(
            "the inputs over the link",
            std::io::Error::other(format!("the init wrote {written:?} where the host sent {sent:?}")),
        )));
    }
    Ok(Some(InputsStaged { skipped: report.skipped, sparse: report.sparse, tree: Some(report.tree), ..staged.clone() }))
}

/// The init's answer to the `Stage` frame: the first frame it sends (outside the numbering);
/// its stderr, if it ends instead, says why.
async fn answer(inbound: &mut super::session::InboundStream) -> Result<Staged, LaunchError> {
    // A `Diag` comes only when the init gives up before it answers (`init/src/run.rs`).
    let mut decoder = Decoder::new(|k| matches!(k, Kind::Staged | Kind::Diag));
    let mut said = Vec::new();
    loop {
        match decoder.next_frame() {
            Ok(Some(f)) if f.kind == Kind::Staged => {
                return serde_json::from_slice(&f.body)
                    .map_err(|e| LaunchError::staging("the init's answer to the inputs", e));
            }
            Ok(Some(f)) => {
                let said = wire::printable(String::from_utf8_lossy(&f.body).trim());
                return Err(LaunchError::staging(
                    "the inputs over the link",
                    std::io::Error::other(format!("the init gave up before it answered: {said}")),
                ));
            }
            Ok(None) => {}
            Err(e) => return Err(LaunchError::staging("the init's answer to the inputs", e)),
        }
        match inbound.next().await {
            Some(Ok(Inbound::Link(bytes))) => decoder.feed(&bytes),
            Some(Ok(Inbound::InitStderr(bytes))) if said.len() < 4096 => said.extend_from_slice(&bytes),
            Some(Ok(Inbound::InitStderr(_))) => {}
            Some(Err(e)) => return Err(LaunchError::staging("the link to the init", e)),
            None => {
                let said = wire::printable(String::from_utf8_lossy(&said).trim());
                return Err(LaunchError::staging(
                    "the inputs over the link",
                    std::io::Error::other(format!("the init ended before it answered: {said}")),
                ));
            }
        }
    }
}
