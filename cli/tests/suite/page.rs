//! `stevedore report OUTCOME.json --html FILE` in a real browser: headless Chromium draws the
//! page of an attempt whose memory climbed to its limit and was OOM-killed, and the picture,
//! not the source, has the limit line's, the memory path's, the peak's tick and the OOM mark's
//! colours where the chart puts them, and each of their labels in rows of its own. Chromium is Debian's `chromium` (`.ci/run` installs it); without it
//! the test is skipped, and under `CI=true` it fails.

use crate::support::{self, BIN};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use stevedore::contract::{Outcome, Reason, Source, Status, Timeline, TimelinePeak};

/// Where the page puts the memory chart's top left corner, in CSS px (`page::MEMORY_CHART_AT`,
/// pinned by its unit test); a screenshot at scale 1 has one pixel per CSS px.
const MEMORY_CHART_AT: (f64, f64) = (16.0, 176.0);
/// The page's documented colours (`cli/src/page.rs`).
const MEMORY: [u8; 3] = [0x1f, 0x77, 0xb4];
const LIMIT: [u8; 3] = [0xd6, 0x27, 0x28];
const OOM: [u8; 3] = [0x94, 0x67, 0xbd];
const PEAK: [u8; 3] = [0xff, 0x7f, 0x0e];
/// The peak label's text: the peak's orange, darkened.
const PEAK_TEXT: [u8; 3] = [0xb3, 0x59, 0x00];
/// The memory chart's labels (their ids) and their text's colours.
const LABELS: [(&str, [u8; 3]); 3] =
    [("memory-limit-label", LIMIT), ("memory-peak-label", PEAK_TEXT), ("oom-label", OOM)];
/// The browser's window: the header and the whole memory chart fit.
const WINDOW: (u32, u32) = (1000, 800);
/// Longer than Chromium ever takes here (under a second; a busy machine, a cold disk).
const BROWSER_TIME: Duration = Duration::from_secs(90);

fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser"]
        .into_iter()
        .find_map(|name| std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file()))
}

/// An attempt whose memory climbed to within 4 MiB of its 128 MiB limit over 1.9 s, OOM-killed
/// at `oom_ms` with the cgroup's peak at `peak_mib`.
fn oom_outcome(log: &Path, peak_mib: u64, oom_ms: u64) -> Outcome {
    const MIB: u64 = 1 << 20;
    let mut o = Outcome::new(Status::OomKilled);
    o.reason = Some(Reason::Oom);
    o.job_id = "page-test".into();
    o.attempt = 1;
    o.signal = Some(9);
    o.usage.wall_time_ms = Some(2100);
    o.usage.peak_memory_bytes = Some(128 * MIB);
    o.evidence.oom_kills = Some(1);
    o.evidence.logs.stdout.path = Some(log.to_string_lossy().into_owned());
    o.evidence.logs.stdout.bytes = 24;
    let mut tl = Timeline::default();
    tl.first_period_ms = 100;
    tl.period_ms = 100;
    for i in 0..20 {
        tl.t_ms.push(i * 100);
        tl.memory_bytes.push(16 * MIB + i * 108 * MIB / 19);
        tl.cpu_ms.push(i * 90);
        tl.pids.push(2);
        tl.out_bytes.push(0);
        tl.tmp_bytes.push(i * 1000);
    }
    tl.memory_limit_bytes = Some(128 * MIB);
    tl.cpu_limit_millicpus = Some(1000);
    tl.oom_kill_ms = Some(oom_ms);
    tl.peak = Some(TimelinePeak { t_ms: 2000, memory_bytes: peak_mib * MIB });
    o.usage.timeline = Some(tl);
    o.usage.sources.timeline = Some(Source::Sampled);
    o
}

/// The attribute `name` of the element `id` in the page's source.
fn attr<'a>(page: &'a str, id: &str, name: &str) -> &'a str {
    let at = page.find(&format!("id=\"{id}\"")).unwrap_or_else(|| panic!("no element {id}"));
    let tag = &page[at..at + page[at..].find('>').unwrap()];
    let value = tag.split(&format!(" {name}=\"")).nth(1).unwrap_or_else(|| panic!("{id} has no {name}: {tag}"));
    &value[..value.find('"').unwrap()]
}

fn num(page: &str, id: &str, name: &str) -> f64 {
    attr(page, id, name).parse().unwrap()
}

/// Draws `page` in headless Chromium: a screenshot of the window, as PNG bytes.
fn screenshot(browser: &Path, page: &Path, dir: &Path) -> Result<Vec<u8>, String> {
    use std::os::unix::process::CommandExt;
    let shot = dir.join("page.png");
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let log = std::fs::File::create(dir.join("chromium.log")).unwrap();
    let started = Instant::now();
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-dev-shm-usage",
        ])
        .arg(format!("--window-size={},{}", WINDOW.0, WINDOW.1))
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", page.display()))
        // Its profile, caches and settings in the test's own dir, never the user's.
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        // A group of its own: a browser that hangs is stopped with its helpers.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", browser.display()))?;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > BROWSER_TIME {
            let group = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
            return Err(format!("chromium did not draw the page within {BROWSER_TIME:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("chromium drew the page in {:.2} s", started.elapsed().as_secs_f64());
    let log = std::fs::read_to_string(dir.join("chromium.log")).unwrap_or_default();
    match std::fs::read(&shot) {
        Ok(png) if status.success() => Ok(png),
        Ok(_) | Err(_) => Err(format!("chromium exited {status} without a screenshot:\n{log}")),
    }
}

/// A decoded screenshot: RGB rows.
struct Picture {
    width: u32,
    height: u32,
    rgb: Vec<u8>,
}

impl Picture {
    fn decode(png: Vec<u8>) -> Self {
        let mut decoder = png::Decoder::new(std::io::Cursor::new(png));
        decoder.set_transformations(png::Transformations::normalize_to_color8());
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        let channels = info.color_type.samples();
        assert!(channels >= 3, "a screenshot in colour, not {:?}", info.color_type);
        let rgb = buf[..info.buffer_size()]
            .chunks(info.line_size)
            .flat_map(|row| row.chunks(channels).take(info.width as usize).flat_map(|px| px[..3].to_vec()))
            .collect();
        Picture { width: info.width, height: info.height, rgb }
    }

    fn at(&self, x: u32, y: u32) -> [u8; 3] {
        let i = ((y * self.width + x) * 3) as usize;
        [self.rgb[i], self.rgb[i + 1], self.rgb[i + 2]]
    }

    /// A pixel within `reach` px of the page's point `(x, y)` (CSS px) that is `want`'s colour,
    /// give or take what anti-aliasing blends in; else what is there.
    fn find(&self, (x, y): (f64, f64), want: [u8; 3], reach: i64) -> Result<(u32, u32), String> {
        let (cx, cy) = (x.round() as i64, y.round() as i64);
        let mut seen = Vec::new();
        for dy in -reach..=reach {
            for dx in -reach..=reach {
                let (px, py) = (cx + dx, cy + dy);
                if px < 0 || py < 0 || px >= i64::from(self.width) || py >= i64::from(self.height) {
                    continue;
                }
                let got = self.at(px as u32, py as u32);
                if close(got, want) {
                    return Ok((px as u32, py as u32));
                }
                seen.push(got);
            }
        }
        seen.dedup();
        Err(format!(
            "no {} within {reach} px of ({cx}, {cy}): {}",
            hex(want),
            seen.iter().map(|c| hex(*c)).collect::<Vec<_>>().join(" ")
        ))
    }
}

fn close(a: [u8; 3], b: [u8; 3]) -> bool {
    a.iter().zip(b).all(|(&a, b)| a.abs_diff(b) <= 40)
}

fn hex(c: [u8; 3]) -> String {
    format!("#{:02x}{:02x}{:02x}", c[0], c[1], c[2])
}

/// What the picture must show, from where the page's source puts each thing.
fn check(picture: &Picture, page: &str, vertices_wanted: Option<usize>) -> Result<(), String> {
    if (picture.width, picture.height) != WINDOW {
        return Err(format!("a {}x{} screenshot, not {WINDOW:?}", picture.width, picture.height));
    }
    let (ox, oy) = MEMORY_CHART_AT;
    let on_page = |x: f64, y: f64| (ox + x, oy + y);
    // The limit: 2 px thick on a whole pixel, so the row just above `y1` is all its colour.
    let (x1, x2, y) =
        (num(page, "memory-limit", "x1"), num(page, "memory-limit", "x2"), num(page, "memory-limit", "y1"));
    for frac in [0.1, 0.3, 0.5, 0.7] {
        picture
            .find(on_page(x1 + (x2 - x1) * frac, y - 1.0), LIMIT, 1)
            .map_err(|e| format!("the memory limit: {e}"))?;
    }
    // The memory path, at its vertices along the climb.
    let d = attr(page, "memory-path", "d");
    let vertices: Vec<(f64, f64)> = d
        .split(['M', 'L'])
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let mut xy = p.split_whitespace().map(|v| v.parse::<f64>().unwrap());
            (xy.next().unwrap(), xy.next().unwrap())
        })
        .collect();
    if vertices_wanted.is_some_and(|n| n != vertices.len()) || vertices.len() < 4 {
        return Err(format!("the memory path has {} points, not {vertices_wanted:?}: {d}", vertices.len()));
    }
    // Looked for where the path is clear of the limit line (a real climb ends on it).
    let clear: Vec<(f64, f64)> = vertices.iter().copied().filter(|&(_, vy)| vy >= y + 6.0).collect();
    if clear.len() < 3 {
        return Err(format!("the memory path has {} points clear of its limit: {d}", clear.len()));
    }
    let picks = [clear[clear.len() / 10], clear[clear.len() / 2], clear[clear.len() * 17 / 20]];
    for &(x, vy) in &picks {
        picture.find(on_page(x, vy), MEMORY, 2).map_err(|e| format!("the memory path: {e}"))?;
    }
    // The peak over the attempt: a tick across the value axis, 2 px on a whole pixel, over the
    // limit line where they meet.
    let (px1, px2, py) =
        (num(page, "memory-peak", "x1"), num(page, "memory-peak", "x2"), num(page, "memory-peak", "y1"));
    for px in [px1 + 1.0, (px1 + px2) / 2.0, px2 - 1.0] {
        picture.find(on_page(px, py - 1.0), PEAK, 0).map_err(|e| format!("the peak's tick: {e}"))?;
    }
    // The OOM mark: vertical, 2 px, on a whole pixel, half way down the plot.
    let (x, y1, y2) = (num(page, "oom-mark", "x1"), num(page, "oom-mark", "y1"), num(page, "oom-mark", "y2"));
    picture.find(on_page(x - 1.0, (y1 + y2) / 2.0), OOM, 1).map_err(|e| format!("the OOM mark: {e}"))?;
    // Between the limit and the climbing memory there is only the plot's background: the
    // colours above were found where they were drawn, not everywhere.
    let (vx, vy) = picks[0];
    let between = on_page(vx, (vy + y) / 2.0);
    let got = picture.at(between.0 as u32, between.1 as u32);
    if [MEMORY, LIMIT, OOM, PEAK].iter().any(|&c| close(got, c)) {
        return Err(format!("{} at {between:?}, between the limit and the memory", hex(got)));
    }
    labels_apart(picture, page)
}

/// Each label of the memory chart is drawn in its colour in rows no other label's colour
/// reaches: the band of its line of text (from the cap height to the descenders), as wide as
/// its text could be, holds its colour and none of the others' (the limit line's rows and
/// the OOM mark's columns, which cross the bands, aside).
fn labels_apart(picture: &Picture, page: &str) -> Result<(), String> {
    let (ox, oy) = MEMORY_CHART_AT;
    let limit_rows = num(page, "memory-limit", "y1") as i64;
    let limit_rows = [limit_rows - 1, limit_rows];
    let oom_cols = num(page, "oom-mark", "x1") as i64;
    let oom_cols = [oom_cols - 1, oom_cols];
    for (id, colour) in LABELS {
        let (x, y) = (num(page, id, "x"), num(page, id, "y"));
        let chars = text_of(page, id).chars().count() as f64;
        let (x0, x1) = match attr(page, id, "text-anchor") {
            "end" => (x - chars * 8.0, x),
            _ => (x, x + chars * 8.0),
        };
        let mut own = 0;
        for py in (y - 11.0) as i64..=(y + 3.0) as i64 {
            if limit_rows.contains(&py) {
                continue;
            }
            for px in x0 as i64..=x1 as i64 {
                if oom_cols.contains(&px) {
                    continue;
                }
                let got = picture.at((ox + px as f64) as u32, (oy + py as f64) as u32);
                if close(got, colour) {
                    own += 1;
                } else if let Some((other, _)) = LABELS.iter().find(|(o, c)| *o != id && close(got, *c)) {
                    return Err(format!("{} of {other} at ({px}, {py}), in the rows of {id} (baseline {y})", hex(got)));
                }
            }
        }
        if own < 3 {
            return Err(format!("{id}: {own} pixels of {} in its rows (baseline {y}, x {x0}..{x1})", hex(colour)));
        }
    }
    Ok(())
}

/// The text of the element `id`.
fn text_of<'a>(page: &'a str, id: &str) -> &'a str {
    let at = page.find(&format!("id=\"{id}\"")).unwrap_or_else(|| panic!("no element {id}"));
    let open = at + page[at..].find('>').unwrap() + 1;
    &page[open..open + page[open..].find('<').unwrap()]
}

/// Writes the page of the Outcome in `outcome` (a file in `dir`) with the built command,
/// renders it in Chromium and checks the picture: the memory limit, the memory's climb, the
/// recorded peak and the OOM mark where the page's source put them. `vertices`: how many
/// points the memory path must have, when the caller knows. Without chromium: a skip, or
/// under `CI=true` a failure.
pub(crate) fn shows_the_climb_the_peak_and_the_kill(dir: &Path, outcome: &Path, vertices: Option<usize>) {
    let Some(browser) = chromium() else {
        if support::in_ci() {
            panic!(
                "CI=true and no chromium on PATH (Debian's `chromium`, which .ci/run installs): the page's browser \
                 test must run"
            );
        }
        eprintln!("SKIP: no chromium on PATH (apt-get install chromium): the page is not checked in a browser");
        support::skip("no chromium");
        return;
    };
    let html = dir.join("o.html");
    let out = Command::new(BIN).arg("report").arg(outcome).arg("--html").arg(&html).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("wrote the page to") && said.contains("o.html"), "{said}");
    let page = std::fs::read_to_string(&html).unwrap();
    let started = std::time::Instant::now();
    let checked = screenshot(&browser, &html, dir).and_then(|png| check(&Picture::decode(png), &page, vertices));
    eprintln!("chromium: page rendered and checked in {:.2} s", started.elapsed().as_secs_f64());
    if let Err(e) = checked {
        panic!("{e}\nthe page, its picture and chromium's log are in {}", dir.display());
    }
}

/// Draws the page of [`oom_outcome`] and checks its picture.
fn draws_a_kill_with_its_peak_at(peak_mib: u64, oom_ms: u64) {
    support::time_limit();
    let t = tempfile::tempdir().unwrap();
    let log = t.path().join("a.stdout");
    std::fs::write(&log, "allocating\nallocating\n").unwrap();
    std::fs::set_permissions(&log, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::set_permissions(t.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let outcome = t.path().join("o.json");
    std::fs::write(&outcome, oom_outcome(&log, peak_mib, oom_ms).to_json()).unwrap();
    let dir = t.keep();
    shows_the_climb_the_peak_and_the_kill(&dir, &outcome, Some(20));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The kill at the limit: the peak is the limit, its tick on the limit line's height.
#[test]
fn a_browser_draws_the_memory_limit_and_the_oom_kill() {
    draws_a_kill_with_its_peak_at(128, 2000);
}

/// A peak a hair above the limit (the kernel's count may pass `memory.max` before it
/// reclaims or kills): the labels of the limit and the peak want one row and are drawn apart.
#[test]
fn a_peak_next_to_the_limit_has_its_label_apart_from_the_limits() {
    draws_a_kill_with_its_peak_at(129, 2000);
}

/// A kill near the start with the peak at the bottom of the axis: the OOM label, right of
/// its early mark, and the peak's, right of the axis, want the same rows over the same
/// columns; they are drawn a line apart.
#[test]
fn an_early_kill_and_a_low_peak_have_their_labels_apart() {
    draws_a_kill_with_its_peak_at(2, 150);
}

/// The README's way (issue 49): `run --outcome o.json --logs ./logs` with relative paths, then
/// `report o.json --html` from another directory: the Outcome records the captures' absolute
/// paths and the page shows both streams' tails.
#[test]
fn a_run_with_relative_logs_shows_its_logs_on_its_page() {
    support::time_limit();
    let t = tempfile::tempdir().unwrap();
    let w = support::worker("page-logs");
    let run = Command::new(BIN)
        .current_dir(t.path())
        .args(["run", "--rung", "process", "--worker", &w, "--quiet", "--outcome", "o.json", "--logs", "logs"])
        .args(["--output", "out", "--", "sh", "-c", "echo out-line; echo err-line >&2"])
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));
    let outcome: serde_json::Value = serde_json::from_slice(&std::fs::read(t.path().join("o.json")).unwrap()).unwrap();
    let logs = t.path().join("logs").canonicalize().unwrap();
    for stream in ["stdout", "stderr"] {
        let path = outcome["evidence"]["logs"][stream]["path"].as_str().unwrap();
        assert!(Path::new(path).is_absolute() && Path::new(path).starts_with(&logs), "{path}");
    }
    let elsewhere = tempfile::tempdir().unwrap();
    let report = Command::new(BIN)
        .current_dir(elsewhere.path())
        .arg("report")
        .arg(t.path().join("o.json"))
        .arg("--html")
        .arg("o.html")
        .output()
        .unwrap();
    assert!(report.status.success(), "{}", String::from_utf8_lossy(&report.stderr));
    let page = std::fs::read_to_string(elsewhere.path().join("o.html")).unwrap();
    assert!(page.contains("id=\"stdout-tail\">out-line\n"), "{page}");
    assert!(page.contains("id=\"stderr-tail\">err-line\n"), "{page}");
    let logs = &page[page.find("<section id=\"logs\">").unwrap()..page.find("<section id=\"evidence\">").unwrap()];
    assert!(!logs.contains("class=\"missing\""), "{logs}");
}
