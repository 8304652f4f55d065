//! Progress on stderr for a run's long transfers (the inputs going in, the outputs coming
//! back): only when stderr is a terminal and not `--quiet`, and only for a transfer that has
//! taken a second (`STEVEDORE_PROGRESS_AFTER`, a duration, changes that). A bar is cleared when
//! its transfer ends, so the summary line stands alone.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stevedore::{Phase, Progress, ProgressSink};

/// How long a transfer runs before its bar is shown, unless the environment says otherwise.
const SHOW_AFTER: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Shown {
    /// The run is over: nothing more is drawn.
    closed: bool,
    /// When the transfer was first heard of, and its bar once shown.
    inputs: Option<(Instant, Option<ProgressBar>)>,
    outputs: Option<(Instant, Option<ProgressBar>)>,
}

/// The bars of one run: its sink draws them; dropped, every bar still drawn is cleared
/// (a transfer cut short never said it finished) and nothing more is drawn.
pub struct Bars {
    shown: Arc<Mutex<Shown>>,
    sink: ProgressSink,
}

impl Bars {
    /// The sink for the request.
    pub fn sink(&self) -> ProgressSink {
        self.sink.clone()
    }
}

impl Drop for Bars {
    fn drop(&mut self) {
        let mut shown = self.shown.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        shown.closed = true;
        let left = [shown.inputs.take(), shown.outputs.take()];
        for bar in left.into_iter().flatten().filter_map(|(_, bar)| bar) {
            bar.finish_and_clear();
        }
    }
}

/// How long work runs before it is shown, or `None` when nothing is to be drawn (`--quiet`,
/// or stderr not a terminal).
fn show_after(quiet: bool) -> Option<Duration> {
    use std::io::IsTerminal;
    if quiet || !std::io::stderr().is_terminal() {
        return None;
    }
    let set = std::env::var("STEVEDORE_PROGRESS_AFTER").ok();
    Some(set.and_then(|d| stevedore::contract::parse_duration(&d).ok()).unwrap_or(SHOW_AFTER))
}

/// Bars on this terminal, or `None` when nothing is to be drawn.
pub fn on_terminal(quiet: bool) -> Option<Bars> {
    let after = show_after(quiet)?;
    let shown = Arc::new(Mutex::new(Shown::default()));
    let drawn = shown.clone();
    let sink = ProgressSink::new(move |p: Progress| {
        let mut shown = drawn.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if shown.closed {
            return;
        }
        let slot = match p.phase {
            Phase::Inputs => &mut shown.inputs,
            _ => &mut shown.outputs,
        };
        let (since, bar) = slot.get_or_insert_with(|| (Instant::now(), None));
        if p.finished {
            if let Some(bar) = bar.take() {
                bar.finish_and_clear();
            }
            return;
        }
        if bar.is_none() && since.elapsed() >= after {
            *bar = Some(new_bar(p));
        }
        if let Some(bar) = bar {
            bar.set_position(p.done);
        }
    });
    Some(Bars { shown, sink })
}

fn new_bar(p: Progress) -> ProgressBar {
    let (name, bar) = match p.total {
        Some(total) => (
            "inputs ",
            ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr()).with_style(
                ProgressStyle::with_template("{prefix}[{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}, {eta} left")
                    .expect("a valid template")
                    .progress_chars("=> "),
            ),
        ),
        None => (
            "outputs ",
            ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()).with_style(
                ProgressStyle::with_template("{prefix}{spinner} {bytes} {bytes_per_sec}").expect("a valid template"),
            ),
        ),
    };
    bar.set_prefix(name);
    bar
}

/// A spinner saying `what` with the time it has taken, shown once the work has taken as long
/// as a transfer's bar waits (on a terminal only, never with `--quiet`); cleared when dropped.
pub fn spinner(what: &str, quiet: bool) -> Option<Spinner> {
    let after = show_after(quiet)?;
    let shown: Arc<Mutex<(bool, Option<ProgressBar>)>> = Arc::default();
    let (slot, what) = (shown.clone(), what.to_owned());
    let task = tokio::spawn(async move {
        tokio::time::sleep(after).await;
        // Under the lock, so a drop meanwhile (closed) is seen and no bar outlives it.
        let mut slot = slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if slot.0 {
            return;
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
            .with_style(ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("a valid template"))
            .with_message(what);
        bar.enable_steady_tick(Duration::from_millis(120));
        slot.1 = Some(bar);
    });
    Some(Spinner { task, shown })
}

/// A spinner under way; cleared when dropped.
#[derive(Debug)]
pub struct Spinner {
    task: tokio::task::JoinHandle<()>,
    shown: Arc<Mutex<(bool, Option<ProgressBar>)>>,
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.task.abort();
        let mut shown = self.shown.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        shown.0 = true;
        if let Some(bar) = shown.1.take() {
            bar.finish_and_clear();
        }
    }
}
