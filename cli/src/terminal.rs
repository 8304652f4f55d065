//! `-t`, this side of the command's terminal: the size of this process's terminal and its
//! changes (SIGWINCH), and raw mode on its stdin while the attempt runs (`-it`), so every key,
//! ^C included, goes to the command as `docker run -it` sends it. Raw mode is undone when the
//! guard drops, before anything is said.

use std::os::fd::AsFd;
use stevedore::Terminal;
use tokio::signal::unix::{SignalKind, signal};

/// The size a terminal gets when this process has none to copy.
const DEFAULT_SIZE: (u16, u16) = (24, 80);

/// Whether this process's stdin is a terminal.
pub fn stdin_is_terminal() -> bool {
    rustix::termios::isatty(std::io::stdin().as_fd())
}

/// The size of this process's terminal (stdin's, else stdout's, else stderr's): rows, columns.
pub fn size() -> (u16, u16) {
    let sizes = [
        rustix::termios::tcgetwinsize(std::io::stdin().as_fd()),
        rustix::termios::tcgetwinsize(std::io::stdout().as_fd()),
        rustix::termios::tcgetwinsize(std::io::stderr().as_fd()),
    ];
    sizes.into_iter().flatten().find(|w| w.ws_row > 0 && w.ws_col > 0).map_or(DEFAULT_SIZE, |w| (w.ws_row, w.ws_col))
}

/// A terminal for the command of this process's size, kept at it: each SIGWINCH sends the new
/// size until the attempt ends (the task is aborted with the returned handle's drop).
pub fn following() -> std::io::Result<(Terminal, Follow)> {
    let (rows, cols) = size();
    let (tx, terminal) = Terminal::new(rows, cols);
    let mut winch = signal(SignalKind::window_change())?;
    let task = tokio::spawn(async move {
        while winch.recv().await.is_some() {
            if tx.send(size()).is_err() {
                return;
            }
        }
    });
    Ok((terminal, Follow(task)))
}

/// Stops following the size when dropped.
#[derive(Debug)]
pub struct Follow(tokio::task::JoinHandle<()>);

impl Drop for Follow {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Raw mode on this process's stdin until dropped (then its settings as they were).
#[derive(Debug)]
pub struct Raw(rustix::termios::Termios);

impl Raw {
    /// Puts stdin, a terminal, in raw mode.
    pub fn enter() -> std::io::Result<Raw> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(stdin.as_fd())?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(stdin.as_fd(), rustix::termios::OptionalActions::Now, &raw)?;
        Ok(Raw(saved))
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(std::io::stdin().as_fd(), rustix::termios::OptionalActions::Now, &self.0);
    }
}

/// Raw mode to come: entered by the first `enter` (the command started), undone when the
/// slot is emptied or dropped. What was typed before it (cooked, waiting) is discarded, so
/// no stray line reaches the command.
#[derive(Debug, Default)]
pub struct RawSlot(std::sync::Mutex<Option<Raw>>, std::sync::atomic::AtomicBool);

impl RawSlot {
    /// Enters raw mode, once.
    pub fn enter(&self) {
        if self.1.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let _ = rustix::termios::tcflush(std::io::stdin().as_fd(), rustix::termios::QueueSelector::IFlush);
        match Raw::enter() {
            Ok(raw) => *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(raw),
            Err(e) => crate::say::say(format!("-it: cannot put this terminal in raw mode: {e}")),
        }
    }

    /// The terminal as it was, now.
    pub fn leave(&self) {
        self.1.store(true, std::sync::atomic::Ordering::SeqCst);
        drop(self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take());
    }
}
