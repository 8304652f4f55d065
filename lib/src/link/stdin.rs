//! The host's half of the command's stdin (`init/src/stdin.rs` is the other): chunks from
//! the caller's [`StdinFeed`](crate::contract::StdinFeed) as `Stdin` frames, never more than
//! the init's window past what the command took, then `StdinEnd`. What the command has not
//! taken yet is kept, and sent again after a resumed link (the init places bytes by their
//! offset, so nothing is taken twice).

use super::session::{Heard, Sender};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Arc;
use stevedore_init::wire::{self, Kind, MAX_CHUNK};
use tokio::sync::mpsc;

/// The init's window (`init/src/stdin.rs`, `WINDOW`).
const WINDOW: u64 = 1 << 20;

/// Sends each new size of the command's terminal to the init, until the caller's half is
/// dropped (a failed write is a cut link; the next size goes on the resumed one).
pub(crate) async fn resizes(sender: Sender, mut rx: tokio::sync::watch::Receiver<(u16, u16)>) {
    while rx.changed().await.is_ok() {
        let (rows, cols) = *rx.borrow_and_update();
        let _ = sender.frame(Kind::Resize, &wire::resize_body(wire::TermSize { rows, cols })).await;
    }
}

/// Sends `feed` to the init until the command takes no more; runs until aborted otherwise
/// (after the feed's end, to say it again after a resumed link).
pub(crate) async fn pump(sender: Sender, heard: Arc<Heard>, mut feed: mpsc::Receiver<Bytes>) {
    // Bytes from `kept_from` to `sent`: sent, not yet taken.
    let mut kept: VecDeque<u8> = VecDeque::new();
    let mut kept_from = 0u64;
    let mut sent = 0u64;
    let mut next: Option<Bytes> = None;
    let mut ended = false;
    let mut resumes = heard.resumes();
    loop {
        let taken = heard.stdin_taken();
        if taken == u64::MAX {
            return;
        }
        let drop_n = usize::try_from(taken.saturating_sub(kept_from)).unwrap_or(usize::MAX).min(kept.len());
        kept.drain(..drop_n);
        kept_from += drop_n as u64;
        if heard.resumes() != resumes {
            resumes = heard.resumes();
            // Whatever the cut link lost, the init still needs: from what it took on.
            let again: Vec<u8> = kept.iter().copied().collect();
            for (i, piece) in again.chunks(MAX_CHUNK).enumerate() {
                let at = kept_from + (i * MAX_CHUNK) as u64;
                let _ = sender.frame(Kind::Stdin, &wire::stdin_body(at, piece)).await;
            }
            if ended {
                let _ = sender.frame(Kind::StdinEnd, &sent.to_be_bytes()).await;
            }
            continue;
        }
        let room = (taken + WINDOW).saturating_sub(sent);
        if ended || room == 0 {
            heard.stdin_news().await;
            continue;
        }
        let chunk = match next.take() {
            Some(c) => c,
            None => tokio::select! {
                got = feed.recv() => match got {
                    Some(c) => c,
                    None => {
                        ended = true;
                        let _ = sender.frame(Kind::StdinEnd, &sent.to_be_bytes()).await;
                        continue;
                    }
                },
                () = heard.stdin_news() => continue,
            },
        };
        let n = chunk.len().min(MAX_CHUNK).min(usize::try_from(room).unwrap_or(usize::MAX));
        if n < chunk.len() {
            next = Some(chunk.slice(n..));
        }
        // A failed write is a cut link: the bytes are kept and go again after the resume.
        let _ = sender.frame(Kind::Stdin, &wire::stdin_body(sent, &chunk[..n])).await;
        kept.extend(&chunk[..n]);
        sent += n as u64;
    }
}
