//! `stevedore report OUTCOME.json --html FILE`: one attempt as one self-contained page to look
//! at (inline CSS and SVG, no script, nothing fetched): the human line, the timeline, the
//! phases, the outputs, the tails of the logs and the evidence.
//!
//! Text that came from the sandbox (or from an Outcome file someone handed over) is untrusted
//! everywhere: it goes through [`text`] or [`block`] (markup escaped, control characters
//! shown as `say` shows them), never into markup or an attribute of its own.
//!
//! The charts have fixed sizes, ids and colours, so that a picture of the page can be checked
//! (`cli/tests/suite/page.rs`) and read:
//!
//! | element | id | colour |
//! |---|---|---|
//! | memory over time | `memory-path` in `memory-chart` | blue `#1f77b4` |
//! | the memory limit | `memory-limit` (horizontal, 2 px) | red `#d62728` |
//! | the OOM kill | `oom-mark` (vertical, 2 px; class `oom-mark` on every chart) | purple `#9467bd` |
//! | the cgroup's peak over the attempt | `memory-peak` (a tick on the value axis, 2 px) | orange `#ff7f0e` |
//! | CPU use, in CPUs | `cpu-path` in `cpu-chart` | green `#2ca02c` |
//! | the CPU limit | `cpu-limit` | red `#d62728` |
//! | processes | `pids-path` in `pids-chart` | brown `#8c564b` |
//! | bytes in `/out`, `/tmp` | `out-path`, `tmp-path` in `disk-chart` | cyan `#17becf`, pink `#e377c2` |
//! | the phases | `phases-bar`, a `phase-NAME` rect each | [`PHASE_COLOURS`] |
//!
//! The memory chart is the first thing under the header: its top left corner is at
//! [`MEMORY_CHART_AT`] in the page (CSS px), whatever the fonts. A mark's label (`ID-label`;
//! the OOM kill's is `oom-label`) sits beside it, and the labels of one chart are stacked
//! [`LABEL_GAP`] apart ([`stack`]): a limit, a peak and an OOM kill at one value never share
//! a row of pixels.
//!
//! An Outcome file is input, of any size up to `common::read_outcome_text`'s cap: it is read
//! within bounds ([`read_bounded`]: every list and map to [`MAX_ROWS`] entries, the timeline
//! thinned as it is read, strings to `MAX_TEXT`, a budget of values for the whole), and the
//! page says what it left out ("… N more", the samples thinned to the charts' width), so a
//! crafted file makes neither a huge page nor a huge process.

use crate::error::CliError;
use crate::report;
use clap::Parser;
use serde_json::Value;
use std::fmt::Write as _;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use stevedore::contract::{LogCapture, Next, Outcome, Status, Timeline};

/// The page's arguments (after `report`).
#[derive(Debug, Parser)]
#[command(
    name = "stevedore report",
    about = "Write one attempt's Outcome as a page to look at in a browser",
    after_help = "Example:\n  stevedore run --outcome o.json --image IMG --output ./out -- CMD\n  \
                  stevedore report o.json --html o.html\n\n\
                  Exit status: 0 written, 1 not written (the reason on stderr), 2 bad arguments."
)]
pub struct ReportArgs {
    /// The Outcome JSON (`stevedore run --outcome FILE`); `-` reads it from stdin
    #[arg(value_name = "OUTCOME.json")]
    outcome: PathBuf,
    /// Where to write the page (one self-contained HTML file)
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
}

/// The words that make `stevedore report ...` a report from inside an attempt rather than a
/// page (`stevedore_init::report::parse_args`).
const SEND_WORDS: [&str; 6] = ["progress", "heartbeat", "note", "data", "--job", "--attempt"];

/// Whether `stevedore report ARGS` asks for a page (`OUTCOME.json --html FILE`) rather than to
/// send a report from inside an attempt; with no arguments at all, the page's usage names both.
pub fn is_page(args: &[String]) -> bool {
    args.first().is_none_or(|a| !SEND_WORDS.contains(&a.as_str()))
}

/// `stevedore report OUTCOME.json --html FILE`: returns the exit status (0 written, 1 not
/// written, 2 bad arguments, as the report verb's).
pub fn main(args: &[String]) -> u8 {
    if args.is_empty() {
        eprintln!(
            "usage: stevedore report OUTCOME.json --html FILE (an attempt's page)\n\
             or, inside an attempt: stevedore {}",
            stevedore_init::report::USAGE.trim_start_matches("usage: ")
        );
        return 2;
    }
    let a = match ReportArgs::try_parse_from(std::iter::once("stevedore report".to_owned()).chain(args.to_vec())) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let Some(html) = a.html else {
        crate::say::say(format!(
            "report: --html FILE is required: `stevedore report {} --html FILE` writes the attempt's page",
            a.outcome.display()
        ));
        return 2;
    };
    let (o, cut) = match read_outcome(&a.outcome) {
        Ok(o) => o,
        Err(e) => {
            return CliError::Failed(e).said();
        }
    };
    match write_whole(&html, render_cut(&o, &cut).as_bytes()) {
        Ok(()) => {
            let shown = std::path::absolute(&html).unwrap_or(html);
            crate::say::say(format!("wrote the page to {}", shown.display()));
            0
        }
        Err(e) => CliError::Failed(format!("--html {}: {e}", html.display())).said(),
    }
}

fn read_outcome(path: &Path) -> Result<(Outcome, Cut), String> {
    let json = crate::common::read_outcome_text(path)?;
    let bad = |e: serde_json::Error| format!("{}: not an Outcome JSON ({e})", path.display());
    let (value, cut) = read_bounded(&json).map_err(bad)?;
    drop(json);
    Ok((serde_json::from_value(value).map_err(bad)?, cut))
}

// ---- reading within bounds ----

/// Rows the page shows of any one list or map (outputs, refused entries, the evidence's
/// lists): the rest is counted, "… N more".
pub const MAX_ROWS: usize = 200;
/// Samples of each timeline column kept as the file is read (halved as they come, so the
/// columns stay aligned); the charts then draw one per pixel column at most.
const MAX_SAMPLES: usize = 2048;
/// A string longer than this is cut as it is read (the page shows 8 KiB of any one at most).
const MAX_TEXT: usize = 16 << 10;
/// Values kept of the whole file: beyond them, what is left is counted, not kept.
const MAX_VALUES: usize = 200_000;
/// The evidence's tables stop past this much of the page.
const MAX_FACTS_BYTES: usize = 4 << 20;
/// The timeline's columns, where the samples are.
const COLUMNS: [&str; 6] = ["t_ms", "memory_bytes", "cpu_ms", "pids", "out_bytes", "tmp_bytes"];

/// What reading left out: by JSON pointer (`/outputs`, `/evidence/notes`), how many entries
/// of a list or map were not kept, or for a timeline column how many samples it had.
#[derive(Debug, Default)]
pub struct Cut {
    more: std::collections::HashMap<String, u64>,
    left: usize,
}

impl Cut {
    /// Entries of the list or map at `pointer` left out when it was read.
    fn more(&self, pointer: &str) -> u64 {
        self.more.get(pointer).copied().unwrap_or(0)
    }
}

/// `json` as a JSON value within the bounds above, and what was left out.
pub fn read_bounded(json: &str) -> Result<(Value, Cut), serde_json::Error> {
    use serde::de::DeserializeSeed;
    let cut = std::cell::RefCell::new(Cut { left: MAX_VALUES, ..Cut::default() });
    let mut de = serde_json::Deserializer::from_str(json);
    let v = Bounded { cut: &cut, at: String::new() }.deserialize(&mut de)?;
    de.end()?;
    Ok((v, cut.into_inner()))
}

/// A value being read at the pointer `at`.
struct Bounded<'c> {
    cut: &'c std::cell::RefCell<Cut>,
    at: String,
}

/// `key` as a JSON pointer's token (RFC 6901).
fn token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

impl Bounded<'_> {
    fn child(&self, key: &str) -> Self {
        Bounded { cut: self.cut, at: format!("{}/{}", self.at, token(key)) }
    }
    /// Takes one value from the budget; `false` once it is spent.
    fn take(&self) -> bool {
        let mut c = self.cut.borrow_mut();
        let had = c.left > 0;
        c.left = c.left.saturating_sub(1);
        had
    }
    fn left_out(&self, n: u64) {
        if n > 0 {
            *self.cut.borrow_mut().more.entry(self.at.clone()).or_default() += n;
        }
    }
    fn is_column(&self) -> bool {
        self.at.strip_prefix("/usage/timeline/").is_some_and(|c| COLUMNS.contains(&c))
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Bounded<'_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Bounded<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(if v.len() > MAX_TEXT {
            let kept = stevedore_init::wire::cap_text(v, MAX_TEXT);
            format!("{kept}… ({} bytes more)", v.len() - kept.len())
        } else {
            v.to_owned()
        }))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        use serde::de::IgnoredAny;
        if self.is_column() {
            // Every other sample dropped whenever the kept ones pass the cap: columns of one
            // length keep the same samples; the last is kept too.
            let (mut kept, mut stride, mut n, mut last) = (Vec::new(), 1u64, 0u64, None);
            while let Some(v) = seq.next_element::<u64>()? {
                if n.is_multiple_of(stride) {
                    kept.push(v);
                    if kept.len() > MAX_SAMPLES {
                        kept = kept.into_iter().step_by(2).collect();
                        stride *= 2;
                    }
                }
                last = Some((n, v));
                n += 1;
            }
            if let Some((_, v)) = last.filter(|(i, _)| !i.is_multiple_of(stride)) {
                kept.push(v);
            }
            if stride > 1 {
                self.cut.borrow_mut().more.insert(self.at.clone(), n);
            }
            return Ok(Value::Array(kept.into_iter().map(Value::from).collect()));
        }
        let mut out = Vec::new();
        let mut skipped = 0u64;
        loop {
            if out.len() < MAX_ROWS && self.take() {
                match seq.next_element_seed(self.child(&out.len().to_string()))? {
                    Some(v) => out.push(v),
                    None => break,
                }
            } else {
                match seq.next_element::<IgnoredAny>()? {
                    Some(_) => skipped += 1,
                    None => break,
                }
            }
        }
        self.left_out(skipped);
        Ok(Value::Array(out))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        use serde::de::IgnoredAny;
        let mut out = serde_json::Map::new();
        let mut skipped = 0u64;
        while let Some(k) = map.next_key::<String>()? {
            if out.len() < MAX_ROWS && self.take() {
                let v = map.next_value_seed(self.child(&k))?;
                out.insert(k, v);
            } else {
                map.next_value::<IgnoredAny>()?;
                skipped += 1;
            }
        }
        self.left_out(skipped);
        Ok(Value::Object(out))
    }
}

/// Writes `bytes` to `path` whole: a temporary file beside it, renamed over it, so that a
/// browser never shows half a page. Private (0600): the page holds the tails of the captures,
/// which stevedore keeps private.
fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.{:08x}", rand::random::<u32>()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes))
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

// ---- escaping ----

/// `s` as HTML text (or a quoted attribute's value) on one line: `& < > " '` escaped, and
/// every control character (newlines included) and bidirectional override shown as `say`
/// shows it on a terminal (`\u{1b}`, `\r`, `\n`), never obeyed.
pub fn text(s: &str) -> String {
    escape(s, false)
}

/// `s` as HTML text that keeps its lines and tabs (a log's tail in a `<pre>`); everything else
/// as [`text`].
pub fn block(s: &str) -> String {
    escape(s, true)
}

fn escape(s: &str, lines: bool) -> String {
    let mut out = String::with_capacity(s.len() + s.len() / 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\n' | '\t' if lines => out.push(c),
            ' '..='~' => out.push(c),
            // Escape sequences in the words stevedore's lines use (a symbol such as `␛` is
            // a box in many fonts).
            c => out.push_str(&crate::say::printable(c.encode_utf8(&mut [0; 4]))),
        }
    }
    out
}

/// At most `max` bytes of `s` (cut at a character), saying how much was left out.
fn capped(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let kept = stevedore_init::wire::cap_text(s, max);
    let left = s.len() - kept.len();
    format!("{kept}… ({left} bytes more)")
}

// ---- figures ----

/// Bytes for people, in binary units.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

fn ms(n: u64) -> String {
    report::secs(Some(n))
}

/// A number in SVG coordinates, one decimal (finite: every scale divides by at least 1).
fn c(v: f64) -> String {
    format!("{v:.1}")
}

// ---- the page ----

/// The page's header is this tall (CSS px; longer text scrolls inside it), so that what
/// follows is where the browser test looks for it.
const HEADER_PX: u32 = 144;
/// A section's heading is this tall.
const HEADING_PX: u32 = 32;
/// The page's side margin.
const SIDE_PX: u32 = 16;
/// The charts' width.
const CHART_W: u32 = 960;
/// Where the memory chart's top left corner is in the page, in CSS px: the first thing under
/// the header and the timeline's heading.
#[cfg_attr(not(test), expect(dead_code, reason = "where the browser test looks, pinned by a unit test"))]
pub const MEMORY_CHART_AT: (u32, u32) = (SIDE_PX, HEADER_PX + HEADING_PX);

const MEMORY: &str = "#1f77b4";
const LIMIT: &str = "#d62728";
const OOM: &str = "#9467bd";
const PEAK: &str = "#ff7f0e";
const CPU: &str = "#2ca02c";
const PIDS: &str = "#8c564b";
const OUT: &str = "#17becf";
const TMP: &str = "#e377c2";
/// The phases' colours, in their order.
pub const PHASE_COLOURS: [&str; 8] =
    ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f"];

fn style() -> String {
    format!(
        "*{{box-sizing:border-box}}\
         body{{margin:0;font:14px/20px system-ui,sans-serif;color:#222;background:#fff}}\
         header{{height:{HEADER_PX}px;overflow:auto;padding:12px {SIDE_PX}px;background:#f4f4f4;\
         border-left:6px solid #c62828}}\
         header.ok{{border-left-color:#2e7d32}}\
         h1{{margin:0;font-size:22px;line-height:32px}}\
         .meta{{color:#555}}\
         .human{{margin:4px 0 0;font-family:ui-monospace,monospace;overflow-wrap:anywhere}}\
         section{{padding:0 {SIDE_PX}px 16px}}\
         h2{{margin:0;height:{HEADING_PX}px;line-height:{HEADING_PX}px;font-size:18px;overflow:hidden}}\
         h3,summary{{margin:12px 0 4px;font-size:15px;font-weight:600}}\
         summary{{cursor:pointer}}\
         svg{{display:block;margin:0}}\
         svg text{{font:12px system-ui,sans-serif;fill:#333}}\
         svg text.label{{paint-order:stroke;stroke:#fbfbfb;stroke-width:3px}}\
         p{{margin:4px 0}}\
         .note{{color:#555}}\
         .missing{{color:#8a4b00}}\
         table{{border-collapse:collapse;margin:4px 0}}\
         th,td{{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}}\
         th{{background:#f4f4f4;font-weight:600}}\
         td.n{{text-align:right;font-variant-numeric:tabular-nums}}\
         .kv .kv{{margin:0}}\
         code,.mono{{font-family:ui-monospace,monospace;overflow-wrap:anywhere}}\
         pre{{margin:4px 0;padding:6px;background:#f6f6f6;border:1px solid #e4e4e4;\
         white-space:pre-wrap;overflow-wrap:anywhere;max-width:{CHART_W}px}}\
         .swatch{{display:inline-block;width:10px;height:10px;margin-right:4px}}\
         .unknown{{color:#888}}"
    )
}

/// The page of one attempt. The captures it names are read now (their tails); the rest is the
/// Outcome's.
#[cfg(test)]
pub fn render(o: &Outcome) -> String {
    render_cut(o, &Cut::default())
}

/// The rung as the command names it (`--rung`), and by its configured name when that differs
/// (`docker` is the container rung's default name).
fn rung_words(executor: &str) -> String {
    match crate::common::RungKind::of_name(executor) {
        Some(kind) if kind.name() == executor => kind.to_string(),
        Some(kind) => format!("{kind} (configured as {executor})"),
        None => executor.to_owned(),
    }
}

/// What a field the run did not set reads as.
const NONE: &str = "<span class=\"unknown\">none</span>";

/// What ran, for the top of the page, as HTML: the command (its argv as a shell would take it,
/// or the handler), the image (tag and id), how it ended (exit code or signal) and the rung.
fn what_ran(o: &Outcome) -> [(&'static str, String); 4] {
    use stevedore::contract::ActionTask;
    let action = o.evidence.action.as_ref();
    let command = match action.map(|a| &a.task) {
        Some(ActionTask::Command(argv)) if !argv.is_empty() => {
            let words: Vec<String> = argv.iter().map(|w| shell_word(w)).collect();
            format!("<code id=\"command\">{}</code>", text(&words.join(" ")))
        }
        Some(ActionTask::Handler(h)) => format!("handler <code id=\"command\">{}</code>", text(h)),
        _ => NONE.to_owned(),
    };
    let tag = o.evidence.image.as_deref().or_else(|| action.and_then(|a| a.image.as_deref()));
    let id = o.evidence.image_id.as_deref().or_else(|| action.and_then(|a| a.image_id.as_deref()));
    let image = match (tag, id) {
        (Some(t), Some(i)) => format!("{} ({})", text(t), text(i)),
        (Some(t), None) => format!("{} (id {NONE})", text(t)),
        (None, Some(i)) => text(i),
        (None, None) => NONE.to_owned(),
    };
    let ended = match (o.exit_code, o.signal) {
        (_, Some(sig)) => match nix::sys::signal::Signal::try_from(sig) {
            Ok(name) => format!("killed by signal {sig} ({name})"),
            Err(_) => format!("killed by signal {sig}"),
        },
        (Some(code), None) => format!("exit code {code}"),
        // The command never ended on its own: it did not start, or the rung ended it.
        (None, None) => NONE.to_owned(),
    };
    let rung = if o.evidence.executor.is_empty() { NONE.to_owned() } else { text(&rung_words(&o.evidence.executor)) };
    [("command", command), ("image", image), ("ended", ended), ("rung", rung)]
}

/// `s` as one word a POSIX shell reads back unchanged: as it is when it holds only safe
/// characters, else single-quoted; a word holding a character a terminal would obey or hide
/// (an output's name is the sandbox's to choose) is written `$'…'` with those characters as
/// `\xNN` bytes, so that what is printed is what a person sees and pastes.
pub(crate) fn shell_word(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-+=:@,%".contains(&b)) {
        return s.to_owned();
    }
    let seen_as_itself = |c: char| {
        let mut b = [0u8; 4];
        let one: &str = c.encode_utf8(&mut b);
        stevedore_init::wire::printable(one) == one
    };
    if s.chars().all(seen_as_itself) {
        return format!("'{}'", s.replace('\'', r"'\''"));
    }
    let mut out = String::from("$'");
    for c in s.chars() {
        if seen_as_itself(c) && c != '\'' && c != '\\' {
            out.push(c);
        } else {
            let mut b = [0u8; 4];
            for byte in c.encode_utf8(&mut b).bytes() {
                out.push_str(&format!("\\x{byte:02x}"));
            }
        }
    }
    out.push('\'');
    out
}

/// [`render`] of an Outcome [`read_bounded`] read, saying what it left out.
pub fn render_cut(o: &Outcome, cut: &Cut) -> String {
    let mut p = String::with_capacity(64 << 10);
    let status = report::status_word(o);
    let reason = o.reason.map(|r| format!(" ({r})")).unwrap_or_default();
    let who = if o.job_id.is_empty() { "an attempt".to_owned() } else { format!("job {}", o.job_id) };
    let _ = write!(
        p,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>stevedore: {} · {}{}</title><style>{}</style></head>\n<body>\n",
        text(&who),
        text(&status),
        text(&reason),
        style()
    );
    let class = if o.status == Status::Ok { " class=\"ok\"" } else { "" };
    let mut meta = vec![who];
    if o.attempt > 0 {
        meta.push(format!("attempt {}", o.attempt));
    }
    if !o.worker.is_empty() {
        meta.push(format!("worker {}", o.worker));
    }
    let _ = write!(
        p,
        "<header{class}><h1 id=\"status\">{}{}</h1><div class=\"meta\">{}</div>\
         <p class=\"human\" id=\"human\">{}</p><table class=\"kv\" id=\"what-ran\">",
        text(&status),
        text(&reason),
        text(&meta.join(", ")),
        text(&report::summary_of(o))
    );
    for (k, v) in what_ran(o) {
        let _ = write!(p, "<tr><th>{k}</th><td>{v}</td></tr>");
    }
    p.push_str("</table></header>\n");
    timeline(&mut p, o, cut);
    phases(&mut p, o);
    outputs(&mut p, o, cut);
    logs(&mut p, o);
    evidence(&mut p, o, cut);
    p.push_str("</body></html>\n");
    p
}

// ---- the timeline ----

/// One chart's frame: its size and where the plot is inside it.
#[derive(Debug, Clone, Copy)]
struct Frame {
    h: f64,
    /// Left of the plot (room for the values).
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
}

impl Frame {
    fn new(h: u32) -> Self {
        Frame { h: f64::from(h), left: 80.0, right: 24.0, top: 28.0, bottom: 24.0 }
    }
    fn plot_w(&self) -> f64 {
        f64::from(CHART_W) - self.left - self.right
    }
    fn plot_h(&self) -> f64 {
        self.h - self.top - self.bottom
    }
}

/// How a chart's values read.
#[derive(Debug, Clone, Copy)]
enum Unit {
    Bytes,
    Cpus,
    Count,
}

impl Unit {
    fn say(self, v: f64) -> String {
        match self {
            // Whole bytes: the axis's values are fractions of a whole number of bytes.
            Unit::Bytes => bytes(v.round() as u64),
            Unit::Cpus => format!("{v:.2} CPUs"),
            Unit::Count => format!("{v:.0}"),
        }
    }
}

/// A line on a chart: `(t_ms, value)` points.
struct Series {
    id: &'static str,
    colour: &'static str,
    name: &'static str,
    points: Vec<(f64, f64)>,
    /// Drawn as steps (a rate over each interval) rather than straight between points.
    steps: bool,
}

/// How far apart (CSS px) the baselines of a chart's labels are at least: a 12 px line of
/// text with its 1.5 px halo either side, and a pixel to spare.
const LABEL_GAP: f64 = 18.0;
/// How far the peak's tick reaches into the plot.
const PEAK_TICK: f64 = 12.0;
/// The peak label's colour: the peak's orange, darkened to read on white.
const PEAK_TEXT: &str = "#b35900";

/// The text beside a mark: `want` is the baseline it would have alone.
struct Label {
    /// Its element id, or empty for none.
    id: String,
    x: f64,
    anchor: &'static str,
    want: f64,
    colour: &'static str,
    text: String,
}

/// Baselines for labels that want `want`, each at least [`LABEL_GAP`] from every other and
/// within `[lo, hi]`, each as near its want as that allows (their order kept). The labels are
/// placed as if in one column: whatever their widths and anchors, no two share a row.
fn stack(want: &[f64], lo: f64, hi: f64) -> Vec<f64> {
    let mut order: Vec<usize> = (0..want.len()).collect();
    order.sort_by(|&a, &b| want[a].total_cmp(&want[b]));
    let mut at = vec![0.0; want.len()];
    let mut below: Option<f64> = None;
    for &i in &order {
        let floor = below.map_or(lo, |b| b + LABEL_GAP);
        at[i] = want[i].max(floor);
        below = Some(at[i]);
    }
    // Pushed past the bottom: the stack is pushed back up from it.
    let mut above: Option<f64> = None;
    for &i in order.iter().rev() {
        let ceiling = above.map_or(hi, |a| a - LABEL_GAP);
        at[i] = at[i].min(ceiling);
        above = Some(at[i]);
    }
    at
}

/// A horizontal line across a chart.
struct Level {
    id: &'static str,
    value: f64,
    label: String,
}

struct Chart {
    id: &'static str,
    title: String,
    frame: Frame,
    unit: Unit,
    series: Vec<Series>,
    limit: Option<Level>,
    /// The cgroup's peak over the attempt: a value, not a sample (the kernel keeps the
    /// highest use and says it at the end, never when it happened).
    peak: Option<f64>,
    oom_ms: Option<f64>,
    /// The time axis, shared by every chart of the page.
    t_max: f64,
}

impl Chart {
    fn x(&self, t: f64) -> f64 {
        self.frame.left + t.clamp(0.0, self.t_max) / self.t_max * self.frame.plot_w()
    }

    /// The top of the value axis: room above the highest value, the limit and the peak.
    fn y_max(&self) -> f64 {
        let highest = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .chain(self.limit.as_ref().map(|l| l.value))
            .chain(self.peak)
            .fold(0.0, f64::max);
        match (highest > 0.0, &self.unit) {
            (true, _) => highest * 1.1,
            // An axis of nothing but zeros still reads as whole figures.
            (false, Unit::Bytes) => 4096.0,
            (false, Unit::Count) => 2.0,
            (false, Unit::Cpus) => 1.0,
        }
    }

    fn y(&self, v: f64, y_max: f64) -> f64 {
        let f = self.frame;
        f.top + f.plot_h() - v.clamp(0.0, y_max) / y_max * f.plot_h()
    }

    fn svg(&self) -> String {
        let f = self.frame;
        let y_max = self.y_max();
        let (w, h) = (CHART_W, f.h);
        let (pl, pt, pw, ph) = (f.left, f.top, f.plot_w(), f.plot_h());
        let mut s = format!(
            "<svg id=\"{}\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\">\
             <rect x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"#ffffff\"/>\
             <text x=\"{pl}\" y=\"18\" font-weight=\"600\">{}</text>\
             <rect x=\"{pl}\" y=\"{pt}\" width=\"{}\" height=\"{}\" fill=\"#fbfbfb\" stroke=\"#cccccc\"/>",
            self.id,
            text(&self.title),
            c(pw),
            c(ph)
        );
        // Value grid and labels: 0, a half, the top.
        for frac in [0.0, 0.5, 1.0] {
            let v = y_max * frac;
            let y = self.y(v, y_max);
            let _ = write!(
                s,
                "<line x1=\"{pl}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#e6e6e6\"/>\
                 <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
                c(pl + pw),
                c(pl - 6.0),
                c(y + 4.0),
                text(&self.unit.say(v)),
                y = c(y)
            );
        }
        // Time labels: the start, the middle, the end.
        for (frac, anchor) in [(0.0, "start"), (0.5, "middle"), (1.0, "end")] {
            let t = self.t_max * frac;
            let _ = write!(
                s,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"{anchor}\">{}</text>",
                c(self.x(t)),
                c(pt + ph + 16.0),
                ms(t.round() as u64)
            );
        }
        for series in &self.series {
            s.push_str(&self.path(series, y_max));
        }
        let mut labels = Vec::new();
        if let Some(l) = &self.limit {
            // On a whole pixel, 2 px thick, edges crisp: its rows are exactly its colour.
            let y = self.y(l.value, y_max).round();
            let _ = write!(
                s,
                "<line id=\"{}\" x1=\"{pl}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"{LIMIT}\" stroke-width=\"2\" \
                 shape-rendering=\"crispEdges\"/>",
                l.id,
                c(pl + pw),
            );
            labels.push(Label {
                id: format!("{}-label", l.id),
                x: pl + pw - 4.0,
                anchor: "end",
                want: y - 5.0,
                colour: LIMIT,
                text: l.label.clone(),
            });
        }
        if let Some(t) = self.oom_ms {
            let x = self.x(t).round();
            let id = if self.id == "memory-chart" { " id=\"oom-mark\"" } else { "" };
            let _ = write!(
                s,
                "<line{id} class=\"oom-mark\" x1=\"{x}\" y1=\"{pt}\" x2=\"{x}\" y2=\"{}\" stroke=\"{OOM}\" \
                 stroke-width=\"2\" shape-rendering=\"crispEdges\"/>",
                c(pt + ph),
            );
            // Left of the mark, unless that would run past the plot's left edge.
            let (x, anchor) = if x - pl >= 140.0 { (x - 4.0, "end") } else { (x + 4.0, "start") };
            labels.push(Label {
                id: if self.id == "memory-chart" { "oom-label".into() } else { String::new() },
                x,
                anchor,
                want: pt + ph - 6.0,
                colour: OOM,
                text: format!("OOM kill at {}", ms(t.round() as u64)),
            });
        }
        if let Some(v) = self.peak {
            // A tick across the value axis at the peak's height, its label just right of it.
            let y = self.y(v, y_max).round();
            let _ = write!(
                s,
                "<line id=\"memory-peak\" x1=\"{}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"{PEAK}\" \
                 stroke-width=\"2\" shape-rendering=\"crispEdges\"><title>the cgroup's peak over the attempt</title></line>",
                c(pl - 4.0),
                c(pl + PEAK_TICK),
            );
            labels.push(Label {
                id: "memory-peak-label".into(),
                x: pl + PEAK_TICK + 4.0,
                anchor: "start",
                want: y + 4.0,
                colour: PEAK_TEXT,
                text: format!("peak {}", bytes(v as u64)),
            });
        }
        let at = stack(&labels.iter().map(|l| l.want).collect::<Vec<_>>(), pt + 14.0, pt + ph - 5.0);
        for (l, y) in labels.iter().zip(at) {
            let id = if l.id.is_empty() { String::new() } else { format!(" id=\"{}\"", l.id) };
            let _ = write!(
                s,
                "<text{id} x=\"{}\" y=\"{}\" text-anchor=\"{}\" class=\"label\" style=\"fill:{}\">{}</text>",
                c(l.x),
                c(y),
                l.anchor,
                l.colour,
                text(&l.text)
            );
        }
        s.push_str("</svg>\n");
        s
    }

    fn path(&self, series: &Series, y_max: f64) -> String {
        let mut d = String::new();
        let mut previous: Option<f64> = None;
        for &(t, v) in &series.points {
            let (x, y) = (c(self.x(t)), c(self.y(v, y_max)));
            match previous {
                None => {
                    let _ = write!(d, "M{x} {y}");
                }
                Some(prev_x) if series.steps => {
                    let _ = write!(d, " L{} {y} L{x} {y}", c(prev_x));
                }
                Some(_) => {
                    let _ = write!(d, " L{x} {y}");
                }
            }
            previous = Some(self.x(t));
        }
        if d.is_empty() {
            return String::new();
        }
        let mut s = format!(
            "<path id=\"{}\" d=\"{d}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2.5\" \
             stroke-linejoin=\"round\"><title>{}</title></path>",
            series.id, series.colour, series.name
        );
        // One point draws no line: a dot shows it.
        if let [(t, v)] = series.points[..] {
            let _ = write!(
                s,
                "<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"{}\"/>",
                c(self.x(t)),
                c(self.y(v, y_max)),
                series.colour
            );
        }
        s
    }
}

/// `(t, column[i])` for as many samples as both have (a column of another length is cut
/// short, never read past).
fn points(t: &[u64], column: &[u64]) -> Vec<(f64, f64)> {
    t.iter().zip(column).map(|(&t, &v)| (t as f64, v as f64)).collect()
}

/// CPU use in CPUs over each interval between samples: Δcpu_ms / Δt_ms, drawn from the
/// interval's start to its end. An interval of no time (or a counter that went back) says
/// nothing.
fn cpu_rates(t: &[u64], cpu_ms: &[u64]) -> Vec<(f64, f64)> {
    let samples: Vec<(u64, u64)> = t.iter().copied().zip(cpu_ms.iter().copied()).collect();
    let mut out = Vec::new();
    for pair in samples.windows(2) {
        let ((t0, c0), (t1, c1)) = (pair[0], pair[1]);
        let Some(dt) = t1.checked_sub(t0).filter(|&dt| dt > 0) else { continue };
        let rate = c1.saturating_sub(c0) as f64 / dt as f64;
        if out.is_empty() {
            out.push((t0 as f64, rate));
        }
        out.push((t1 as f64, rate));
    }
    out
}

/// The columns of the timeline, with their names in the Outcome.
fn columns(tl: &Timeline) -> [(&'static str, &[u64]); 5] {
    [
        ("memory_bytes", &tl.memory_bytes),
        ("cpu_ms", &tl.cpu_ms),
        ("pids", &tl.pids),
        ("out_bytes", &tl.out_bytes),
        ("tmp_bytes", &tl.tmp_bytes),
    ]
}

/// Why `column` has no samples, as a paragraph, or nothing when it has some.
fn missing(tl: &Timeline, column: &str, samples: usize) -> String {
    if samples > 0 {
        return String::new();
    }
    let why = tl.missing.get(column).map_or("the Outcome does not say why", String::as_str);
    format!("<p class=\"missing\">No <code>{column}</code> samples: {}.</p>\n", text(why))
}

/// The sample indices a chart draws: all of them, or evenly spread over at most one per
/// pixel column of the plot, the first and the last kept.
fn thinned(n: usize) -> Vec<usize> {
    let width = Frame::new(0).plot_w() as usize;
    if n <= width {
        return (0..n).collect();
    }
    (0..width).map(|k| k * (n - 1) / (width - 1)).collect()
}

/// `column` at `idx` (those it has).
fn pick(column: &[u64], idx: &[usize]) -> Vec<u64> {
    idx.iter().filter_map(|&i| column.get(i).copied()).collect()
}

fn timeline(p: &mut String, o: &Outcome, cut: &Cut) {
    p.push_str("<section id=\"timeline\"><h2>Timeline</h2>\n");
    let Some(tl) = &o.usage.timeline else {
        let why = o.usage.sources.timeline.as_ref().map_or_else(
            || "the Outcome does not say why (an older stevedore, or a rung that does not sample)".to_owned(),
            ToString::to_string,
        );
        let _ = writeln!(p, "<p id=\"timeline-none\" class=\"missing\">No timeline: {}.</p></section>", text(&why));
        return;
    };
    // Thinned to the charts' width: a crafted timeline of millions of samples draws as one of
    // the plot's pixels (the first and the last kept), and says so below.
    let had = cut.more("/usage/timeline/t_ms").max(tl.t_ms.len() as u64);
    let idx = thinned(tl.t_ms.len());
    let shown = idx.len();
    let mut drawn = tl.clone();
    for column in [
        &mut drawn.t_ms,
        &mut drawn.memory_bytes,
        &mut drawn.cpu_ms,
        &mut drawn.pids,
        &mut drawn.out_bytes,
        &mut drawn.tmp_bytes,
    ] {
        *column = pick(column, &idx);
    }
    let tl = &drawn;
    let t = &tl.t_ms;
    // The peak's time is when it was read, not when it happened: it stretches no axis.
    let t_max = t.iter().copied().chain(tl.oom_kill_ms).max().unwrap_or(0).max(1) as f64;
    let oom_ms = tl.oom_kill_ms.map(|v| v as f64);
    let memory_limit = tl.memory_limit_bytes.map(|l| Level {
        id: "memory-limit",
        value: l as f64,
        label: format!("limit {}", bytes(l)),
    });
    let peak = tl.peak.as_ref().map(|pk| pk.memory_bytes as f64);
    let mut title = "Memory".to_owned();
    if let Some(l) = tl.memory_limit_bytes {
        let _ = write!(title, " (limit {})", bytes(l));
    }
    let memory = Chart {
        id: "memory-chart",
        title,
        frame: Frame::new(240),
        unit: Unit::Bytes,
        series: vec![Series {
            id: "memory-path",
            colour: MEMORY,
            name: "memory in use",
            points: points(t, &tl.memory_bytes),
            steps: false,
        }],
        limit: memory_limit,
        peak,
        oom_ms,
        t_max,
    };
    // First under the heading, where MEMORY_CHART_AT says.
    p.push_str(&memory.svg());
    p.push_str(&missing(tl, "memory_bytes", t.len().min(tl.memory_bytes.len())));
    if let Some(pk) = &tl.peak {
        let _ = writeln!(
            p,
            "<p class=\"note\">The orange tick on the value axis is the cgroup's peak over the attempt, {}: the \
             highest use at any moment, which the samples may have missed (the kernel says it at the end, not \
             when it happened).</p>",
            bytes(pk.memory_bytes)
        );
    }
    other_charts(p, tl, t_max, oom_ms);
    facts(p, o, tl, had, shown);
    p.push_str("</section>\n");
}

/// The CPU, pids and disk charts under the memory's, each with what it lacks.
fn other_charts(p: &mut String, tl: &Timeline, t_max: f64, oom_ms: Option<f64>) {
    let t = &tl.t_ms;
    let cpu_limit = tl.cpu_limit_millicpus.map(|m| Level {
        id: "cpu-limit",
        value: m as f64 / 1000.0,
        label: format!("limit {:.2} CPUs", m as f64 / 1000.0),
    });
    let rates = cpu_rates(t, &tl.cpu_ms);
    let cpu = Chart {
        id: "cpu-chart",
        title: "CPU, in CPUs (CPU time used over each interval ÷ its length)".to_owned(),
        frame: Frame::new(160),
        unit: Unit::Cpus,
        series: vec![Series { id: "cpu-path", colour: CPU, name: "CPU use", points: rates, steps: true }],
        limit: cpu_limit,
        peak: None,
        oom_ms,
        t_max,
    };
    p.push_str(&cpu.svg());
    let cpu_samples = t.len().min(tl.cpu_ms.len());
    p.push_str(&missing(tl, "cpu_ms", cpu_samples));
    if cpu_samples == 1 {
        p.push_str("<p class=\"missing\">One CPU sample: no interval to measure a rate over.</p>\n");
    }
    let pids = Chart {
        id: "pids-chart",
        title: "Processes and threads".to_owned(),
        frame: Frame::new(160),
        unit: Unit::Count,
        series: vec![Series { id: "pids-path", colour: PIDS, name: "pids", points: points(t, &tl.pids), steps: false }],
        limit: None,
        peak: None,
        oom_ms,
        t_max,
    };
    p.push_str(&pids.svg());
    p.push_str(&missing(tl, "pids", t.len().min(tl.pids.len())));
    let disk = Chart {
        id: "disk-chart",
        title: "Bytes in /out (cyan) and /tmp (pink)".to_owned(),
        frame: Frame::new(160),
        unit: Unit::Bytes,
        series: vec![
            Series { id: "out-path", colour: OUT, name: "/out", points: points(t, &tl.out_bytes), steps: false },
            Series { id: "tmp-path", colour: TMP, name: "/tmp", points: points(t, &tl.tmp_bytes), steps: false },
        ],
        limit: None,
        peak: None,
        oom_ms,
        t_max,
    };
    p.push_str(&disk.svg());
    p.push_str(&missing(tl, "out_bytes", t.len().min(tl.out_bytes.len())));
    p.push_str(&missing(tl, "tmp_bytes", t.len().min(tl.tmp_bytes.len())));
}

/// What the charts rest on: the samples, drawn and had, their periods, their source; the
/// reasons for what they lack not said under a chart.
fn facts(p: &mut String, o: &Outcome, tl: &Timeline, had: u64, shown: usize) {
    let t = &tl.t_ms;
    let mut facts = vec![format!("{} samples", t.len())];
    if had > shown as u64 {
        facts[0] = format!("{had} samples, {shown} of them drawn (thinned to the charts' width)");
    }
    if tl.first_period_ms > 0 {
        facts.push(format!("every {} at first", ms(tl.first_period_ms)));
    }
    if tl.period_ms > 0 && tl.period_ms != tl.first_period_ms {
        facts.push(format!("every {} at the end (thinned as the attempt went on)", ms(tl.period_ms)));
    }
    if let Some(src) = &o.usage.sources.timeline {
        facts.push(format!("source: {src}"));
    }
    let _ = writeln!(p, "<p class=\"note\">Times since the command started; {}.</p>", text(&facts.join(", ")));
    if t.is_empty() {
        p.push_str("<p class=\"missing\">The timeline has no samples.</p>\n");
    }
    // A reason not said under a chart: for a column that has samples after all, or for one
    // this page does not know.
    for (column, why) in &tl.missing {
        let said = columns(tl).iter().any(|(name, col)| name == column && t.len().min(col.len()) == 0);
        if !said {
            let _ = writeln!(p, "<p class=\"missing\">{}: {}</p>", text(column), text(why));
        }
    }
}

// ---- the phases ----

fn phases(p: &mut String, o: &Outcome) {
    let ph = &o.evidence.phases;
    let all = [
        ("prepared", "prepared", ph.prepared_ms),
        ("inputs-staged", "inputs staged", ph.inputs_staged_ms),
        ("created", "created", ph.created_ms),
        ("started", "started", ph.started_ms),
        ("command-started", "command started", ph.command_started_ms),
        ("command-ended", "command ended", ph.command_ended_ms),
        ("outputs-collected", "outputs collected", ph.outputs_collected_ms),
        ("concluded", "concluded", ph.concluded_ms),
    ];
    p.push_str("<section id=\"phases\"><h2>Phases</h2>\n");
    // Each reached phase ends a segment that began where the one before it ended (or when the
    // rung took the attempt). An offset below the one before it (clocks are not that kind,
    // but an Outcome is only data) makes an empty segment, never a negative one.
    let mut segments = Vec::new();
    let mut end = 0u64;
    for (i, (key, label, at)) in all.iter().enumerate() {
        if let Some(at) = *at {
            let start = end;
            end = end.max(at);
            segments.push((key, label, PHASE_COLOURS[i], start, end, at));
        }
    }
    if segments.is_empty() {
        p.push_str(
            "<p class=\"missing\">No phase was timed (a rung without stevedore's init, or an older \
             stevedore).</p></section>\n",
        );
        return;
    }
    let total = end.max(1) as f64;
    let (w, h, bar_h) = (CHART_W, 40, 28.0);
    let _ = write!(p, "<svg id=\"phases-bar\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\">");
    for &(key, label, colour, start, end, _) in &segments {
        let x = start as f64 / total * f64::from(w);
        let width = (end - start) as f64 / total * f64::from(w);
        let took = ms(end - start);
        let _ = write!(
            p,
            "<rect id=\"phase-{key}\" x=\"{}\" y=\"4\" width=\"{}\" height=\"{bar_h}\" fill=\"{colour}\">\
             <title>until {label}: {took}</title></rect>",
            c(x),
            c(width)
        );
        // Its time inside it when it fits (about 7 px a character); the table has them all.
        if width >= (took.len() as f64) * 7.0 + 8.0 {
            let _ = write!(
                p,
                "<text x=\"{}\" y=\"23\" text-anchor=\"middle\" style=\"fill:#111111\">{took}</text>",
                c(x + width / 2.0)
            );
        }
    }
    p.push_str("</svg>\n<table id=\"phases-table\"><tr><th>phase</th><th>reached at</th><th>took</th></tr>\n");
    for &(_, label, colour, start, end, at) in &segments {
        let _ = writeln!(
            p,
            "<tr><td><span class=\"swatch\" style=\"background:{colour}\"></span>{label}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            ms(at),
            ms(end - start)
        );
    }
    p.push_str(
        "</table>\n<p class=\"note\">Milliseconds since the rung took the attempt; each segment is the time \
         until its phase was reached.</p></section>\n",
    );
}

// ---- the outputs ----

/// "… N more" as the last row of a table of `cols` columns, when `n` rows were left out.
fn more_row(p: &mut String, cols: usize, n: u64) {
    if n > 0 {
        let _ = writeln!(p, "<tr><td colspan=\"{cols}\" class=\"note\">… {n} more</td></tr>");
    }
}

fn outputs(p: &mut String, o: &Outcome, cut: &Cut) {
    p.push_str("<section id=\"outputs\"><h2>Outputs</h2>\n");
    if o.outputs.is_empty() {
        p.push_str("<p>No output file.</p>\n");
    } else {
        let shown = o.outputs.len().min(MAX_ROWS);
        let more = (o.outputs.len() - shown) as u64 + cut.more("/outputs");
        let total: u64 = o.outputs.iter().map(|f| f.size).fold(0, u64::saturating_add);
        let all = o.outputs.len() as u64 + cut.more("/outputs");
        let sum = if cut.more("/outputs") > 0 {
            format!("{} in the {} read", bytes(total), o.outputs.len())
        } else {
            bytes(total)
        };
        let _ = writeln!(
            p,
            "<p>{all} file{}, {sum}.</p>\n<table id=\"outputs-table\"><tr><th>path</th><th>size</th><th>bytes</th>\
             <th>digest</th><th>type</th></tr>",
            if all == 1 { "" } else { "s" },
        );
        for f in &o.outputs[..shown] {
            let _ = writeln!(
                p,
                "<tr><td class=\"mono\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                 <td class=\"mono\">{}</td><td>{}</td></tr>",
                text(&capped(&f.name, 4096)),
                bytes(f.size),
                f.size,
                text(&capped(&f.hash, 200)),
                text(&capped(&f.content_type, 200))
            );
        }
        more_row(p, 5, more);
        p.push_str("</table>\n");
    }
    let refused = &o.evidence.refused_outputs;
    if !refused.is_empty() {
        p.push_str("<h3>Not collected</h3><table id=\"refused-outputs\"><tr><th>path</th><th>why</th></tr>\n");
        let shown = refused.len().min(MAX_ROWS);
        for r in &refused[..shown] {
            let _ = writeln!(
                p,
                "<tr><td class=\"mono\">{}</td><td>{}</td></tr>",
                text(&capped(&r.name, 4096)),
                text(&capped(&r.why, 1024))
            );
        }
        more_row(p, 2, (refused.len() - shown) as u64 + cut.more("/evidence/refused_outputs"));
        p.push_str("</table>\n");
    }
    p.push_str("</section>\n");
}

// ---- the logs ----

/// Of a capture, at most the last this many bytes...
const TAIL_BYTES: u64 = 4 << 10;
/// ...and of those, the last this many lines.
const TAIL_LINES: usize = 40;

/// Why a capture the Outcome names is not shown.
#[derive(Debug, PartialEq)]
enum Unread {
    /// Nothing is there (removed, or the Outcome was made on another machine).
    NotFound,
    /// Another user's file or directory: never read.
    NotOurs(u32),
    /// Not what stevedore leaves as a capture, or unreadable: why.
    Refused(String),
}

/// The end of the capture of `stream` at `path`: `(text, whether it is all of the file)`, or
/// why not.
///
/// The Outcome is input: a path in it could name any file of the user's (a key, a token) and
/// the page is made to be passed around. So only what looks as stevedore leaves a capture is
/// read: a regular file named `*.{stream}` (`<attempt>.stdout`), not reached through a
/// symlink, owned by this user and private to them (no group or other bits), in a directory
/// that is also theirs and private.
fn tail(path: &Path, stream: &str) -> Result<(String, bool), Unread> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let euid = nix::unistd::geteuid().as_raw();
    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::NotFound => Unread::NotFound,
        _ => Unread::Refused(e.to_string()),
    };
    if !path.is_absolute() {
        return Err(Unread::Refused(
            "a relative path (stevedore records absolute ones; this Outcome does not say relative to what): not read"
                .into(),
        ));
    }
    if path.extension().is_none_or(|e| e != stream) {
        return Err(Unread::Refused(format!("not a stevedore capture (a path named *.{stream}): not read")));
    }
    let private = |m: &std::fs::Metadata| m.uid() == euid && m.mode() & 0o077 == 0;
    let dir = path.parent().map(std::fs::symlink_metadata).transpose().map_err(io)?;
    match dir {
        Some(d) if d.is_dir() && d.uid() != euid => return Err(Unread::NotOurs(d.uid())),
        Some(d) if d.is_dir() && private(&d) => {}
        _ => return Err(Unread::Refused("its directory is not this user's private one: not read".into())),
    }
    // Non-blocking: a FIFO named in an Outcome must not hang the page; it is then refused as
    // not a regular file. No symlink followed at the last component.
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_NOFOLLOW).bits())
        .open(path)
        .map_err(io)?;
    let meta = f.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(Unread::Refused("not a regular file".into()));
    }
    if meta.uid() != euid {
        return Err(Unread::NotOurs(meta.uid()));
    }
    if !private(&meta) {
        return Err(Unread::Refused("not a private file of this user's: not read".into()));
    }
    let from = meta.len().saturating_sub(TAIL_BYTES);
    f.seek(std::io::SeekFrom::Start(from)).map_err(io)?;
    let mut buf = Vec::new();
    f.take(TAIL_BYTES).read_to_end(&mut buf).map_err(io)?;
    let mut whole = from == 0;
    let mut kept: &[u8] = &buf;
    // A tail cut mid-line starts at the next whole line, when there is one.
    if !whole && let Some(nl) = kept.iter().position(|&b| b == b'\n') {
        kept = &kept[nl + 1..];
    }
    let s = String::from_utf8_lossy(kept);
    let lines: Vec<&str> = s.lines().collect();
    if lines.len() > TAIL_LINES {
        whole = false;
    }
    let mut out = lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n");
    if s.ends_with('\n') && !out.is_empty() {
        out.push('\n');
    }
    Ok((out, whole))
}

fn logs(p: &mut String, o: &Outcome) {
    p.push_str("<section id=\"logs\"><h2>Logs</h2>\n");
    let l = &o.evidence.logs;
    for (name, cap) in [("stdout", &l.stdout), ("stderr", &l.stderr)] {
        capture(p, name, cap);
    }
    if o.evidence.live_dropped_bytes > 0 {
        let _ = writeln!(
            p,
            "<p class=\"note\">{} of live output did not reach the caller (the captures have them).</p>",
            bytes(o.evidence.live_dropped_bytes)
        );
    }
    p.push_str("</section>\n");
}

fn capture(p: &mut String, name: &str, cap: &LogCapture) {
    let mut facts = format!("{} in all", bytes(cap.bytes));
    if cap.truncated {
        facts.push_str(", the capture keeps only part of it");
    }
    let _ = write!(p, "<h3>{name}</h3><p>{facts}");
    let Some(path) = &cap.path else {
        p.push_str("; the capture was not kept (<code>stevedore run --logs DIR</code> keeps it).</p>\n");
        return;
    };
    let _ = writeln!(p, "; captured in <code>{}</code>.</p>", text(path));
    match tail(Path::new(path), name) {
        Ok((_, _)) if cap.bytes == 0 => {}
        Ok((t, _)) if t.is_empty() => p.push_str("<p class=\"note\">The capture is empty.</p>\n"),
        Ok((t, whole)) => {
            if !whole {
                let _ =
                    writeln!(p, "<p class=\"note\">Its last {TAIL_LINES} lines or {} at most:</p>", bytes(TAIL_BYTES));
            }
            let _ = writeln!(p, "<pre id=\"{name}-tail\">{}</pre>", block(&t));
        }
        Err(Unread::NotFound) => {
            p.push_str("<p class=\"missing\">The capture is not found: nothing is there now (removed, or this Outcome comes from another machine).</p>\n");
        }
        Err(Unread::NotOurs(uid)) => {
            let _ =
                writeln!(p, "<p class=\"missing\">Not this user's capture (it belongs to uid {uid}): not read.</p>");
        }
        Err(Unread::Refused(why)) => {
            let _ = writeln!(p, "<p class=\"missing\">The capture is not shown: {}.</p>", text(&why));
        }
    }
}

// ---- the evidence ----

fn evidence(p: &mut String, o: &Outcome, cut: &Cut) {
    p.push_str(
        "<section id=\"evidence\"><h2>Evidence</h2>\n<details id=\"attempt-details\"><summary>The attempt</summary>\n\
         <table class=\"kv\" id=\"attempt-table\">",
    );
    let next = match o.next() {
        Next::Done => "done",
        Next::Retry => "retry (spends one of the job's retries)",
        Next::Requeue => "requeue (it never ran: no retry spent)",
        Next::GiveUp => "give up (retrying cannot help)",
        _ => "see the Outcome",
    };
    let opt = |v: Option<i32>| v.map_or_else(|| NONE.to_owned(), |v| v.to_string());
    let rows = [
        ("status", text(&o.status.to_string())),
        ("reason", o.reason.map_or_else(|| NONE.to_owned(), |r| text(&r.to_string()))),
        ("exit code", opt(o.exit_code)),
        ("signal", opt(o.signal)),
        ("permanent", o.permanent.to_string()),
        ("next", next.to_owned()),
        ("job", text(&o.job_id)),
        ("attempt", o.attempt.to_string()),
        ("worker", text(&o.worker)),
    ];
    for (k, v) in rows {
        let _ = write!(p, "<tr><th>{k}</th><td>{v}</td></tr>");
    }
    if !o.handler_error.is_empty() {
        let _ = write!(
            p,
            "<tr><th>handler error</th><td><pre id=\"handler-error\">{}</pre></td></tr>",
            block(&capped(&o.handler_error, 8 << 10))
        );
    }
    p.push_str(
        "</table></details>\n<details id=\"usage-details\"><summary>Usage</summary>\n<table id=\"usage-table\">\
         <tr><th>figure</th><th>value</th><th>source</th></tr>\n",
    );
    let u = &o.usage;
    let src = |s: &Option<stevedore::contract::Source>| {
        s.as_ref().map_or_else(|| "<span class=\"unknown\">not said</span>".to_owned(), |s| text(&s.to_string()))
    };
    let figure =
        |v: Option<u64>, say: fn(u64) -> String| v.map_or_else(|| NONE.to_owned(), |v| format!("{} ({v})", say(v)));
    let usage_rows = [
        ("wall time", figure(u.wall_time_ms, ms), src(&u.sources.wall_time_ms)),
        ("CPU time", figure(u.cpu_time_ms, ms), src(&u.sources.cpu_time_ms)),
        ("peak memory", figure(u.peak_memory_bytes, bytes), src(&u.sources.peak_memory_bytes)),
        ("disk written", figure(u.disk_written_bytes, bytes), src(&u.sources.disk_written_bytes)),
        (
            "OOM kills",
            o.evidence.oom_kills.map_or_else(|| NONE.to_owned(), |n| n.to_string()),
            src(&u.sources.oom_kills),
        ),
    ];
    for (k, v, s) in usage_rows {
        let _ = writeln!(p, "<tr><th>{k}</th><td class=\"n\">{v}</td><td>{s}</td></tr>");
    }
    p.push_str("</table></details>\n<details id=\"facts-details\"><summary>Facts</summary>\n");
    // Every field of the evidence, as the JSON names it, but those drawn above.
    match serde_json::to_value(&o.evidence) {
        Ok(Value::Object(mut m)) => {
            m.remove("phases");
            m.remove("logs");
            p.push_str("<table class=\"kv\" id=\"evidence-table\">");
            let facts = Facts { cut, until: p.len() + MAX_FACTS_BYTES };
            for (k, v) in &m {
                let _ = write!(p, "<tr><th>{}</th><td>", text(k));
                facts.json(p, v, &format!("/evidence/{}", token(k)), 0);
                p.push_str("</td></tr>\n");
            }
            more_row(p, 2, cut.more("/evidence"));
            p.push_str("</table>\n");
        }
        _ => p.push_str("<p class=\"missing\">The evidence could not be shown.</p>\n"),
    }
    p.push_str("</details>\n</section>\n");
}

/// Deeper than any evidence nests: what is below is shown as JSON text.
const MAX_DEPTH: usize = 6;

/// The evidence's facts as HTML, within the page's bounds.
struct Facts<'c> {
    cut: &'c Cut,
    /// The page's length past which the rest is left out.
    until: usize,
}

impl Facts<'_> {
    /// A JSON value at `at` (its pointer) as HTML: objects and arrays of objects as nested
    /// key/value tables, lists of words one a line, `null` as none; at most [`MAX_ROWS`]
    /// entries of each, then "… N more" (with those reading left out).
    fn json(&self, p: &mut String, v: &Value, at: &str, depth: usize) {
        if p.len() > self.until {
            p.push_str("<span class=\"unknown\">… (the page shows no more of the evidence)</span>");
            return;
        }
        let more = |n: usize| n.saturating_sub(MAX_ROWS) as u64 + self.cut.more(at);
        match v {
            // A field the run did not set: nothing is unknown about it.
            Value::Null => p.push_str(NONE),
            Value::Bool(b) => p.push_str(if *b { "true" } else { "false" }),
            Value::Number(n) => p.push_str(&n.to_string()),
            Value::String(s) => p.push_str(&text(&capped(s, 4096))),
            Value::Array(a) if a.is_empty() => p.push_str(NONE),
            Value::Object(m) if m.is_empty() => p.push_str(NONE),
            _ if depth >= MAX_DEPTH => p.push_str(&text(&capped(&v.to_string(), 4096))),
            Value::Array(a) if a.iter().all(|v| !v.is_object() && !v.is_array()) => {
                for (i, item) in a.iter().take(MAX_ROWS).enumerate() {
                    if i > 0 {
                        p.push_str("<br>");
                    }
                    self.json(p, item, &format!("{at}/{i}"), depth + 1);
                }
                if more(a.len()) > 0 {
                    let _ = write!(p, "<br><span class=\"note\">… {} more</span>", more(a.len()));
                }
            }
            Value::Array(a) => {
                p.push_str("<table class=\"kv\">");
                for (i, item) in a.iter().take(MAX_ROWS).enumerate() {
                    let _ = write!(p, "<tr><th>{}</th><td>", i + 1);
                    self.json(p, item, &format!("{at}/{i}"), depth + 1);
                    p.push_str("</td></tr>");
                }
                more_row(p, 2, more(a.len()));
                p.push_str("</table>");
            }
            Value::Object(m) => {
                p.push_str("<table class=\"kv\">");
                for (k, item) in m.iter().take(MAX_ROWS) {
                    let _ = write!(p, "<tr><th>{}</th><td>", text(k));
                    self.json(p, item, &format!("{at}/{}", token(k)), depth + 1);
                    p.push_str("</td></tr>");
                }
                more_row(p, 2, more(m.len()));
                p.push_str("</table>");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use stevedore::contract::{
        CacheUse, EnvOverride, InputsStaged, NarrowedLimit, OutputFile, Reason, RefusedEntry, ReportsSeen, Source,
        SparseInput, TimelinePeak,
    };

    /// Markup, a quote that would end an attribute, and the control bytes a terminal obeys.
    const HOSTILE: &str = "</svg></table></pre><script>alert(1)</script>\"onload=alert(2) 'x' \x1b[31m\0\r\x07\u{9b}\u{202e}\
                           \u{2028}\u{2029}\u{200b}\u{feff}\u{2060}";

    fn outcome_with_timeline(n: usize) -> Outcome {
        let mut o = Outcome::new(Status::OomKilled);
        o.reason = Some(Reason::Oom);
        let mut tl = Timeline::default();
        tl.first_period_ms = 100;
        tl.period_ms = 100;
        for i in 0..n as u64 {
            tl.t_ms.push(i * 100);
            tl.memory_bytes.push((i + 1) << 20);
            tl.cpu_ms.push(i * 50);
            tl.pids.push(1 + i % 3);
            tl.out_bytes.push(i * 10);
            tl.tmp_bytes.push(i * 20);
        }
        tl.memory_limit_bytes = Some(64 << 20);
        tl.cpu_limit_millicpus = Some(500);
        tl.oom_kill_ms = Some(n as u64 * 100);
        tl.peak = Some(TimelinePeak { t_ms: n as u64 * 100 + 20, memory_bytes: 64 << 20 });
        o.usage.timeline = Some(tl);
        o.usage.sources.timeline = Some(Source::Sampled);
        o
    }

    /// What no page may ever hold, whatever the Outcome.
    fn assert_clean(page: &str) {
        for raw in [
            "<script",
            "\"onload=",
            "'x'",
            "\x1b",
            "\0",
            "\r",
            "\x07",
            "\u{9b}",
            "\u{202e}",
            "\u{2028}",
            "\u{2029}",
            "\u{200b}",
            "\u{feff}",
            "\u{2060}",
        ] {
            assert!(!page.contains(raw), "{raw:?} is in the page raw");
        }
        assert_eq!(page.matches("<svg ").count(), page.matches("</svg>").count(), "an svg closed early");
        assert_eq!(page.matches("<pre").count(), page.matches("</pre>").count(), "a pre closed early");
        for external in ["http:", "https:", "src=", "url(", "<link", "<iframe", "<img", "@import"] {
            assert!(!page.contains(external), "{external:?} in the page");
        }
    }

    /// Every coordinate a number (`format!` writes `NaN` and `inf` for what is not).
    fn assert_finite(page: &str) {
        for bad in ["NaN", "\"inf", "\"-inf", " inf", "Linf", "Minf"] {
            assert!(!page.contains(bad), "{bad:?} in the page: {page}");
        }
    }

    #[test]
    fn escaping_shows_markup_and_control_bytes_as_text() {
        assert_eq!(text("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
        assert_eq!(text("\x1b[31m\0\r\n\t\x7f"), "\\u{1b}[31m\\u{0}\\r\\n\\t\\u{7f}");
        assert_eq!(block("a\nb\tc\r"), "a\nb\tc\\r");
        assert_eq!(text("\u{9b}x\u{202e}y"), "\\u{9b}x\\u{202e}y");
        // Issue 41, 4: a line or paragraph separator, a zero-width space, a BOM (from a real
        // output's name too) are shown, not obeyed or hidden; in a log's block as well.
        assert_eq!(text("a\u{2028}b\u{2029}c\u{200b}d\u{feff}"), "a\\u{2028}b\\u{2029}c\\u{200b}d\\u{feff}");
        assert_eq!(block("a\u{2028}b\n"), "a\\u{2028}b\n");
        assert_eq!(text("plain ünïcode ✓"), "plain ünïcode ✓");
    }

    #[test]
    fn sandbox_text_is_escaped_in_every_field() {
        let h = || HOSTILE.to_owned();
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("a.stdout");
        private(&log, &format!("line one\n{HOSTILE}\nlast\n"));
        let mut o = outcome_with_timeline(5);
        o.job_id = h();
        o.worker = h();
        o.handler_error = format!("{HOSTILE}\nsecond line {HOSTILE}");
        o.outputs.push(OutputFile { name: h(), size: 3, hash: h(), content_type: h() });
        let e = &mut o.evidence;
        e.executor = h();
        e.worker = h();
        e.incarnation = h();
        e.container_id = Some(h());
        e.pod = Some(h());
        e.node = Some(h());
        e.image = Some(h());
        e.image_id = Some(h());
        e.engine_version = Some(h());
        e.api_version = Some(h());
        e.runtime = Some(h());
        e.enforcement.insert(h(), h());
        e.skipped.insert(h(), h());
        e.limits_narrowed.push(NarrowedLimit { key: h(), from: 2, to: 1, why: h() });
        e.logs.stdout = LogCapture { path: Some(log.to_string_lossy().into_owned()), bytes: 40, truncated: false };
        e.logs.stderr = LogCapture { path: Some(format!("/nonexistent/{HOSTILE}")), bytes: 4, truncated: true };
        e.refused_outputs.push(RefusedEntry { name: h(), why: h() });
        e.env_overrides.push(EnvOverride { key: h(), origin: h(), overrode: vec![h()] });
        e.ports.insert(h(), h());
        e.refused_claims.push(h());
        e.init = Some(h());
        e.inputs = Some(InputsStaged {
            skipped: vec![h()],
            sparse: vec![SparseInput { name: h(), apparent_bytes: 1, allocated_bytes: 0 }],
            ..Default::default()
        });
        e.init_diagnostics.push(h());
        e.caches.insert(h(), CacheUse { volume: h(), path: h(), bytes: None });
        e.recovered = Some(h());
        e.reports = Some(ReportsSeen { refusals: vec![h()], ..Default::default() });
        e.hook_failures.push(h());
        e.notes.push(h());
        let s = &mut o.usage.sources;
        s.wall_time_ms = Some(Source::unavailable(HOSTILE));
        s.cpu_time_ms = Some(Source::unavailable(HOSTILE));
        s.timeline = Some(Source::unavailable(HOSTILE));
        if let Some(tl) = o.usage.timeline.as_mut() {
            tl.pids.clear();
            tl.missing.insert("pids".into(), h());
            tl.missing.insert(h(), h());
        }
        let page = render(&o);
        assert_clean(&page);
        assert!(page.contains(
            "&lt;script&gt;alert(1)&lt;/script&gt;&quot;onload=alert(2) &#39;x&#39; \\u{1b}[31m\\u{0}\\r\\u{7}"
        ));
        // The hostile text shows in each place it was put (the evidence's map keys twice).
        assert!(page.matches("&lt;script&gt;").count() >= 40, "{}", page.matches("&lt;script&gt;").count());
        assert!(page.contains("id=\"stdout-tail\">line one\n"), "the capture's tail is shown");
        assert!(page.contains("The capture is not shown: not a stevedore capture"));
        // Without a timeline, the reason is the untrusted one.
        o.usage.timeline = None;
        assert_clean(&render(&o));
    }

    #[test]
    fn a_word_is_said_as_a_shell_reads_it_back_and_never_raw() {
        assert_eq!(shell_word("/tmp/r/run-1/t"), "/tmp/r/run-1/t");
        assert_eq!(shell_word("it's here"), r"'it'\''s here'");
        assert_eq!(shell_word(""), "''");
        // A name the sandbox chose with a terminal's escape and a bidi override: bytes.
        assert_eq!(shell_word("a\x1b[2Jb\u{202e}'"), r"$'a\x1b[2Jb\xe2\x80\xae\x27'");
        let sh = |w: &str| {
            let o = std::process::Command::new("bash").args(["-c", &format!("printf %s {w}")]).output().unwrap();
            String::from_utf8(o.stdout).unwrap()
        };
        for word in ["it's here", "a\x1b[2Jb\u{202e}'\\", "tab\there\n"] {
            assert_eq!(sh(&shell_word(word)), word, "bash reads it back");
        }
    }

    #[test]
    fn the_rung_is_named_as_the_command_names_it() {
        assert_eq!(rung_words("docker"), "container (configured as docker)");
        assert_eq!(rung_words("process"), "process");
        assert_eq!(rung_words("gpu-pool"), "gpu-pool");
    }

    #[test]
    fn no_timeline_says_why() {
        let mut o = Outcome::new(Status::Ok);
        o.usage.sources.timeline = Some(Source::unavailable("the rung does not sample"));
        let page = render(&o);
        assert!(page.contains("id=\"timeline-none\""));
        assert!(page.contains("No timeline: unavailable: the rung does not sample."), "{page}");
        assert!(!page.contains("memory-chart"));
        o.usage.sources.timeline = None;
        assert!(render(&o).contains("No timeline: the Outcome does not say why"));
        assert_clean(&render(&o));
    }

    #[test]
    fn an_oom_is_marked_with_the_limit_and_the_peak() {
        let o = outcome_with_timeline(20);
        let page = render(&o);
        for id in ["memory-chart", "memory-path", "memory-limit", "oom-mark", "memory-peak", "cpu-path", "cpu-limit"] {
            assert!(page.contains(&format!("id=\"{id}\"")), "no {id}");
        }
        assert_eq!(page.matches("class=\"oom-mark\"").count(), 4, "on every chart");
        assert!(page.contains("OOM kill at 2.0 s"));
        assert!(page.contains(&format!("stroke=\"{LIMIT}\"")));
        // The memory chart comes first in the timeline, where MEMORY_CHART_AT says.
        let timeline = page.find("<section id=\"timeline\">").unwrap();
        let first_svg = timeline + page[timeline..].find("<svg").unwrap();
        assert!(page[first_svg..].starts_with("<svg id=\"memory-chart\" width=\"960\" height=\"240\""));
        assert_eq!(MEMORY_CHART_AT, (16, 176));
        assert_clean(&page);
        let mut ok = outcome_with_timeline(3);
        if let Some(tl) = ok.usage.timeline.as_mut() {
            tl.oom_kill_ms = None;
        }
        assert!(!render(&ok).contains("oom-mark"));
    }

    #[test]
    fn the_limit_line_is_above_the_memory_and_on_a_whole_pixel() {
        let page = render(&outcome_with_timeline(10));
        let limit = &page[page.find("id=\"memory-limit\"").unwrap()..];
        let y1: f64 = limit.split("y1=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
        assert_eq!(y1.fract(), 0.0);
        let path = &page[page.find("id=\"memory-path\"").unwrap()..];
        let d = path.split(" d=\"").nth(1).unwrap().split('"').next().unwrap();
        let ys: Vec<f64> = d
            .split(['M', 'L'])
            .filter(|p| !p.trim().is_empty())
            .map(|p| p.split_whitespace().nth(1).unwrap().parse().unwrap())
            .collect();
        assert_eq!(ys.len(), 10);
        assert!(ys.iter().all(|&y| y > y1), "memory below its limit: {ys:?} vs {y1}");
        assert!(ys.windows(2).all(|w| w[1] < w[0]), "climbing: {ys:?}");
    }

    /// `name` of the element `id` as a number.
    fn num_of(page: &str, id: &str, name: &str) -> f64 {
        let at = page.find(&format!("id=\"{id}\"")).unwrap_or_else(|| panic!("no {id}"));
        let tag = &page[at..at + page[at..].find('>').unwrap()];
        tag.split(&format!(" {name}=\"")).nth(1).unwrap().split('"').next().unwrap().parse().unwrap()
    }

    #[test]
    fn labels_wanting_one_row_are_stacked_a_gap_apart_inside_the_bounds() {
        assert_eq!(stack(&[50.0, 120.0, 200.0], 40.0, 210.0), vec![50.0, 120.0, 200.0], "apart already: kept");
        let at = stack(&[100.0, 100.0, 101.0], 40.0, 210.0);
        assert_eq!(at, vec![100.0, 118.0, 136.0], "pushed down in their order");
        let at = stack(&[205.0, 209.0, 207.0], 40.0, 210.0);
        assert_eq!(at, vec![174.0, 210.0, 192.0], "pushed back up from the bottom");
        let at = stack(&[0.0, 3.0], 40.0, 210.0);
        assert_eq!(at, vec![40.0, 58.0], "never above the top");
        assert!(stack(&[], 0.0, 1.0).is_empty());
    }

    /// The peak is a value over the attempt: a tick across the value axis, not a point at the
    /// time the kernel was read (which stretched the time axis past the samples).
    #[test]
    fn the_peak_is_a_tick_on_the_value_axis_and_dates_nothing() {
        let page = render(&outcome_with_timeline(10));
        let f = Frame::new(240);
        let (x1, x2) = (num_of(&page, "memory-peak", "x1"), num_of(&page, "memory-peak", "x2"));
        assert!(x1 < f.left && f.left < x2 && x2 - x1 <= 20.0, "across the axis: {x1}..{x2}");
        let (y, limit) = (num_of(&page, "memory-peak", "y1"), num_of(&page, "memory-limit", "y1"));
        assert_eq!((y, y.fract()), (limit, 0.0), "a 64 MiB peak at the 64 MiB limit, on a whole pixel");
        assert!(page.contains("the cgroup's peak over the attempt, 64.0 MiB"), "{page}");
        assert!(!page.contains("<circle id=\"memory-peak\""));
        // The time axis ends at the OOM kill (1.0 s), not at the peak's reading (1.02 s).
        assert_eq!(num_of(&page, "oom-mark", "x1"), (f.left + f.plot_w()).round());
    }

    /// A limit, a peak and an OOM kill at one height (the kill at the limit, the memory
    /// pinned at the bottom of the axis by a huge limit, the kill at the start): whichever
    /// rows they want, their labels are a line apart and inside the plot.
    #[test]
    fn the_limit_peak_and_oom_labels_never_share_a_row() {
        let f = Frame::new(240);
        for (limit, peak, oom) in [(64u64 << 20, 64u64 << 20, 1000), (64 << 20, 63 << 20, 1000), (1 << 40, 1 << 20, 0)]
        {
            let mut o = outcome_with_timeline(10);
            let tl = o.usage.timeline.as_mut().unwrap();
            tl.memory_limit_bytes = Some(limit);
            tl.peak = Some(TimelinePeak { t_ms: 1000, memory_bytes: peak });
            tl.oom_kill_ms = Some(oom);
            let page = render(&o);
            let mut ys: Vec<f64> = ["memory-limit-label", "memory-peak-label", "oom-label"]
                .iter()
                .map(|id| num_of(&page, id, "y"))
                .collect();
            ys.sort_by(f64::total_cmp);
            assert!(ys.windows(2).all(|w| w[1] - w[0] >= LABEL_GAP), "{limit} {peak} {oom}: {ys:?}");
            assert!(ys[0] >= f.top + 12.0 && ys[2] <= f.top + f.plot_h(), "inside the plot: {ys:?}");
        }
    }

    #[test]
    fn one_sample_or_empty_columns_draw_without_dividing_by_zero() {
        let mut o = outcome_with_timeline(1);
        let page = render(&o);
        assert!(page.contains("One CPU sample: no interval"));
        assert_finite(&page);
        let tl = o.usage.timeline.as_mut().unwrap();
        tl.t_ms = vec![0, 0, 0];
        tl.memory_bytes.clear();
        tl.cpu_ms = vec![5, 3, 9];
        tl.pids.clear();
        tl.out_bytes.clear();
        tl.tmp_bytes = vec![1];
        tl.peak = None;
        tl.oom_kill_ms = None;
        tl.memory_limit_bytes = None;
        tl.cpu_limit_millicpus = None;
        tl.missing = BTreeMap::from([("memory_bytes".to_owned(), "no memory.current".to_owned())]);
        let page = render(&o);
        assert_finite(&page);
        assert!(page.contains("No <code>memory_bytes</code> samples: no memory.current."));
        assert!(page.contains("No <code>pids</code> samples: the Outcome does not say why."));
        assert!(!page.contains("id=\"cpu-path\""), "no interval of any length: no rate");
        o.usage.timeline = Some(Timeline::default());
        let page = render(&o);
        assert!(page.contains("The timeline has no samples."));
        assert_finite(&page);
    }

    /// Issue 41, 4: a crafted Outcome's lists and timeline are read within bounds and the page
    /// says what it left out; the charts draw one sample per pixel column at most.
    #[test]
    fn long_lists_and_timelines_are_cut_and_say_so() {
        let mut o = outcome_with_timeline(100_000);
        o.outputs = (0..10_000)
            .map(|i| OutputFile { name: format!("f{i}"), size: 1, hash: "sha256:00".into(), content_type: "x".into() })
            .collect();
        o.evidence.notes = (0..5_000).map(|i| format!("note {i}")).collect();
        o.evidence.enforcement = (0..5_000).map(|i| (format!("k{i}"), "v".to_owned())).collect();
        let json = o.to_json();
        let (value, cut) = read_bounded(&json).unwrap();
        let read: Outcome = serde_json::from_value(value).unwrap();
        assert_eq!(read.outputs.len(), MAX_ROWS);
        assert!(read.usage.timeline.as_ref().unwrap().t_ms.len() <= MAX_SAMPLES + 1);
        let page = render_cut(&read, &cut);
        assert!(page.contains("<p>10000 files, "), "the count is the file's");
        assert!(page.contains(&format!("… {} more", 10_000 - MAX_ROWS)), "outputs");
        assert!(page.contains(&format!("… {} more", 5_000 - MAX_ROWS)), "notes and enforcement");
        assert!(page.contains("100000 samples, 856 of them drawn"), "{}", &page[..2000]);
        let points = |id: &str| {
            let at = page.find(&format!("id=\"{id}\" d=\"")).unwrap();
            page[at..].split('"').nth(3).unwrap().matches('L').count() + 1
        };
        assert!(points("memory-path") <= 856, "{}", points("memory-path"));
        assert!(page.len() < 1 << 20, "{} bytes", page.len());
        // The same Outcome rendered from memory is cut as well.
        let page = render(&o);
        assert!(page.contains(&format!("… {} more", 10_000 - MAX_ROWS)));
        assert!(page.len() < 2 << 20, "{} bytes", page.len());
        assert_clean(&page);
    }

    #[test]
    fn huge_values_do_not_overflow() {
        let mut o = outcome_with_timeline(3);
        o.usage.wall_time_ms = Some(u64::MAX);
        o.usage.peak_memory_bytes = Some(u64::MAX);
        o.outputs =
            vec![OutputFile { name: "a".into(), size: u64::MAX, hash: String::new(), content_type: String::new() }; 2];
        let tl = o.usage.timeline.as_mut().unwrap();
        tl.t_ms = vec![0, u64::MAX - 1, u64::MAX];
        tl.memory_bytes = vec![u64::MAX; 3];
        tl.cpu_ms = vec![0, u64::MAX, 0];
        tl.memory_limit_bytes = Some(u64::MAX);
        tl.cpu_limit_millicpus = Some(u64::MAX);
        tl.oom_kill_ms = Some(u64::MAX);
        tl.peak = Some(TimelinePeak { t_ms: u64::MAX, memory_bytes: u64::MAX });
        let ph = &mut o.evidence.phases;
        ph.prepared_ms = Some(u64::MAX);
        ph.created_ms = Some(3);
        ph.concluded_ms = Some(u64::MAX);
        let page = render(&o);
        assert!(page.contains("16.0 EiB"));
        assert_finite(&page);
        assert_clean(&page);
    }

    #[test]
    fn the_phases_are_one_bar_in_their_order() {
        let mut o = Outcome::new(Status::Ok);
        let ph = &mut o.evidence.phases;
        ph.prepared_ms = Some(10);
        ph.created_ms = Some(40);
        ph.started_ms = Some(30);
        ph.command_started_ms = Some(100);
        ph.concluded_ms = Some(1000);
        let page = render(&o);
        let ids = ["phase-prepared", "phase-created", "phase-started", "phase-command-started", "phase-concluded"];
        let at: Vec<usize> = ids.iter().map(|id| page.find(&format!("id=\"{id}\"")).unwrap()).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "in order");
        assert!(!page.contains("phase-inputs-staged"), "a phase not reached has no segment");
        assert!(page.contains("<title>until concluded: 900 ms</title>"));
        assert!(page.contains("<title>until started: 0 ms</title>"), "an offset that went back is empty");
        assert!(!render(&Outcome::new(Status::Ok)).contains("phases-bar"));
    }

    /// A private file of this user's at `path`, in a private dir, as stevedore writes a capture.
    fn private(path: &Path, content: &str) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, content).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(path.parent().unwrap(), std::fs::Permissions::from_mode(0o700)).unwrap();
    }

    #[test]
    fn a_capture_shows_its_tail_and_says_when_it_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let long = dir.path().join("long.stdout");
        let lines: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        private(&long, &lines);
        let (t, whole) = tail(&long, "stdout").unwrap();
        assert!(!whole);
        assert_eq!(t.lines().count(), TAIL_LINES);
        assert!(t.starts_with("line 960\n") && t.ends_with("line 999\n"), "{t}");
        let short = dir.path().join("short.stderr");
        private(&short, "a\nb");
        assert_eq!(tail(&short, "stderr").unwrap(), ("a\nb".to_owned(), true));
        assert!(tail(dir.path(), "stdout").is_err(), "a directory is not a capture");
        let fifo = dir.path().join("fifo.stdout");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR).unwrap();
        assert_eq!(
            tail(&fifo, "stdout").unwrap_err(),
            Unread::Refused("not a regular file".into()),
            "and a FIFO does not hang the page"
        );
        let mut o = Outcome::new(Status::Ok);
        o.evidence.logs.stdout =
            LogCapture { path: Some(long.to_string_lossy().into()), bytes: 8890, truncated: false };
        o.evidence.logs.stderr = LogCapture { path: None, bytes: 0, truncated: false };
        let page = render(&o);
        assert!(page.contains("Its last 40 lines"));
        assert!(page.contains("the capture was not kept"));
    }

    /// "Not found" only about what is not there; another user's capture says so; a relative
    /// path (an Outcome does not say relative to what) is not read.
    #[test]
    fn a_capture_not_shown_says_why_in_its_own_words() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let gone = dir.path().join("gone.stdout");
        assert_eq!(tail(&gone, "stdout").unwrap_err(), Unread::NotFound);
        let page = |path: &Path| {
            let mut o = Outcome::new(Status::Ok);
            o.evidence.logs.stdout =
                LogCapture { path: Some(path.to_string_lossy().into()), bytes: 4, truncated: false };
            render(&o)
        };
        let p = page(&gone);
        assert!(p.contains("The capture is not found") && !p.contains("not a stevedore capture"), "{p}");
        private(&dir.path().join("there.stdout"), "hi\n");
        assert!(matches!(tail(Path::new("there.stdout"), "stdout"), Err(Unread::Refused(w)) if w.contains("relative")));
        // Another user's: as root, a directory given away; otherwise root's own /etc.
        let theirs = if nix::unistd::geteuid().is_root() {
            let other = tempfile::tempdir().unwrap();
            let f = other.path().join("a.stdout");
            private(&f, "secret\n");
            let nobody = Some(nix::unistd::Uid::from_raw(65534));
            nix::unistd::chown(other.path(), nobody, None).unwrap();
            nix::unistd::chown(&f, nobody, None).unwrap();
            assert_eq!(tail(&f, "stdout").unwrap_err(), Unread::NotOurs(65534));
            let p = page(&f);
            assert!(p.contains("Not this user's capture (it belongs to uid 65534)") && !p.contains("secret"), "{p}");
            Some(other)
        } else {
            assert_eq!(tail(Path::new("/etc/passwd.stdout"), "stdout").unwrap_err(), Unread::NotOurs(0));
            None
        };
        drop(theirs);
    }

    /// An Outcome is input: one that names a secret of the user's as its capture must not
    /// copy it into a page made to be passed around.
    #[test]
    fn an_outcome_naming_another_file_as_its_capture_gets_nothing_of_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("id_ed25519");
        private(&key, "-----BEGIN OPENSSH PRIVATE KEY-----\n");
        let open = dir.path().join("shared.stdout");
        private(&open, "-----BEGIN OPENSSH PRIVATE KEY-----\n");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        let link = dir.path().join("link.stdout");
        std::os::unix::fs::symlink(&key, &link).unwrap();
        let public = tempfile::tempdir().unwrap();
        let in_public = public.path().join("a.stdout");
        private(&in_public, "-----BEGIN OPENSSH PRIVATE KEY-----\n");
        std::fs::set_permissions(public.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        for (path, stream) in [
            (key.clone(), "stdout"),
            (open, "stdout"),
            (link, "stdout"),
            (in_public, "stdout"),
            (dir.path().join("long.stdout"), "stderr"),
            ("/proc/self/environ".into(), "stdout"),
        ] {
            assert!(tail(&path, stream).is_err(), "{} read as {stream}", path.display());
            let mut o = Outcome::new(Status::Ok);
            o.evidence.logs.stdout =
                LogCapture { path: Some(path.to_string_lossy().into()), bytes: 40, truncated: false };
            let page = render(&o);
            assert!(!page.contains("PRIVATE KEY") && !page.contains("PATH="), "{}", path.display());
        }
    }

    /// The top says what ran: the command as typed, the image by tag and id, how it ended and
    /// the rung, before anything else; a field the run did not set says "none".
    #[test]
    fn the_top_says_what_ran_and_the_evidence_is_folded() {
        let req = stevedore::contract::Request::command("j", ["sh", "-c", "echo it's > /out/y"], "/o");
        let mut o = Outcome::new(Status::HandlerError);
        o.exit_code = Some(3);
        o.evidence.executor = "docker".into();
        o.evidence.action = Some(stevedore::contract::Action::of_request(&req, "docker", None));
        o.evidence.image = Some("busybox:latest".into());
        o.evidence.image_id = Some("sha256:feed".into());
        let page = render(&o);
        let top =
            &page[page.find("<table class=\"kv\" id=\"what-ran\">").expect(&page)..page.find("</header>").unwrap()];
        assert_eq!(
            top,
            "<table class=\"kv\" id=\"what-ran\">\
             <tr><th>command</th><td><code id=\"command\">sh -c &#39;echo it&#39;\\&#39;&#39;s &gt; /out/y&#39;</code></td></tr>\
             <tr><th>image</th><td>busybox:latest (sha256:feed)</td></tr>\
             <tr><th>ended</th><td>exit code 3</td></tr>\
             <tr><th>rung</th><td>container (configured as docker)</td></tr></table>"
        );
        assert!(page.find("id=\"what-ran\"") < page.find("<section"), "at the top");
        for id in ["attempt", "usage", "facts"] {
            let open = page.find(&format!("<details id=\"{id}-details\"><summary>")).expect(id);
            assert!(page.find(&format!("id=\"{id}-table\"")).map_or(id == "facts", |t| t > open), "{id} folded");
        }
        assert_eq!(page.matches("<details").count(), page.matches("</details>").count());
        assert!(page.contains("id=\"evidence-table\""));
        // Unset: said none, never unknown.
        assert!(!page.contains(">unknown<"), "{page}");
        let bare = render(&Outcome::new(Status::Killed));
        let top = &bare[bare.find("id=\"what-ran\"").unwrap()..bare.find("</header>").unwrap()];
        assert_eq!(top.matches(">none</span>").count(), 4, "{top}");
        assert!(!bare.contains(">unknown<"));
        // A signal is said by number and name; an image without a tag by its id.
        o.signal = Some(9);
        o.evidence.image = None;
        let page = render(&o);
        assert!(page.contains("<tr><th>ended</th><td>killed by signal 9 (SIGKILL)</td></tr>"), "{page}");
        assert!(page.contains("<tr><th>image</th><td>sha256:feed</td></tr>"), "{page}");
        o.evidence.action = Some(stevedore::contract::Action::of_request(
            &stevedore::contract::Request::handler("j", "thumbnail", "/o"),
            "docker",
            None,
        ));
        assert!(render(&o).contains("<tr><th>command</th><td>handler <code id=\"command\">thumbnail</code></td></tr>"));
    }

    #[test]
    fn the_page_is_whole_and_fetches_nothing() {
        let mut o = outcome_with_timeline(30);
        o.outputs.push(OutputFile {
            name: "report/sizes.txt".into(),
            size: 1234,
            hash: format!("sha256:{}", "ab".repeat(32)),
            content_type: "text/plain".into(),
        });
        o.evidence.enforcement.insert("memory".into(), "cgroup memory limit".into());
        o.evidence.phases.concluded_ms = Some(12);
        let page = render(&o);
        assert!(page.starts_with("<!DOCTYPE html>") && page.ends_with("</html>\n"));
        assert!(
            page.contains("report/sizes.txt") && page.contains("1.2 KiB") && page.contains("ab".repeat(32).as_str())
        );
        assert!(page.contains(&report::summary_of(&o)), "the human line, as `run` says it");
        assert_clean(&page);
    }

    #[test]
    fn arguments_choose_the_page_or_a_report() {
        let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(is_page(&words(&["o.json", "--html", "o.html"])));
        assert!(is_page(&words(&["--html", "o.html", "o.json"])));
        assert!(is_page(&[]));
        for send in [&["progress", "50"][..], &["note", "hi"], &["heartbeat"], &["--job", "j", "note", "x"]] {
            assert!(!is_page(&words(send)), "{send:?}");
        }
    }

    #[test]
    fn the_page_is_written_whole_and_bad_input_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let o = dir.path().join("o.json");
        std::fs::write(&o, outcome_with_timeline(3).to_json()).unwrap();
        let html = dir.path().join("o.html");
        let args = |a: &[&Path]| a.iter().map(|p| p.to_string_lossy().into_owned()).collect::<Vec<_>>();
        assert_eq!(main(&args(&[&o, Path::new("--html"), &html])), 0);
        assert!(std::fs::read_to_string(&html).unwrap().contains("memory-chart"));
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 2, "no temporary file left: {left:?}");
        assert_eq!(main(&args(&[&o])), 2, "without --html");
        assert_eq!(main(&args(&[&dir.path().join("none.json"), Path::new("--html"), &html])), 1);
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "{\"status\": ").unwrap();
        assert_eq!(main(&args(&[&bad, Path::new("--html"), &html])), 1);
        assert!(read_outcome(&bad).unwrap_err().contains("not an Outcome JSON"));
        assert!(read_outcome(&dir.path().join("none.json")).unwrap_err().starts_with("cannot read the Outcome"));
        assert_eq!(main(&args(&[&o, Path::new("--html"), &dir.path().join("no/such/dir/o.html")])), 1);
    }
}
