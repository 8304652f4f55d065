//! Local development on stevedore: this binary is its own worker. It registers a handler
//! (`render`: a report of the files in its input dir), packs itself into a `FROM scratch`
//! worker image, runs the handler in a container on files of `target/local-dev-example/in`
//! (and in-process, to check both give the same report), then runs a web server in the
//! busybox image with a published port, fetches its page from the host and stops it.
//! It prints where the outputs and logs are, and exits 1 if anything is not as expected.
//!
//! ```sh
//! cargo run --example local_dev
//! ```
//!
//! Needs a local Docker-API engine (nothing is pulled), `ldd` (to pack this dynamically
//! linked binary) and Debian's static `/bin/busybox` (the image
//! `stevedore-test/busybox:latest` is built `FROM scratch` from it when missing).

#[path = "common/mod.rs"]
mod common;
use common::{BUSYBOX_IMAGE, build_busybox, leftovers};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use stevedore::image::{PackSpec, ensure_image};
use stevedore::{
    CancellationToken, ContainerConfig, ContainerExecutor, Executor, HandlerContext, HandlerError, Handlers,
    InProcessExecutor, LaunchError, Outcome, Reason, Request, Status,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DIR: &str = "target/local-dev-example";
/// Marks the images this example packs (to remove those of its earlier builds).
const EXAMPLE_LABEL: &str = "dev.stevedore.example";
/// The port the web server listens on inside its container.
const SERVER_PORT: u16 = 8080;

/// This worker's handlers: the container rung re-execs this binary to run them.
fn handlers() -> Handlers {
    Handlers::new().with_version(env!("CARGO_PKG_VERSION")).register("render", render)
}

/// Writes `report.md` (a table of the input files: bytes, lines, words) and `summary.json`.
async fn render(ctx: HandlerContext) -> Result<(), HandlerError> {
    let input = ctx.input_dir.clone();
    let files = tokio::task::spawn_blocking(move || -> Result<Vec<(String, Vec<u8>)>, HandlerError> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&input).map_err(|e| HandlerError::context(input.display(), e))? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                files.push((entry.file_name().to_string_lossy().into_owned(), std::fs::read(entry.path())?));
            }
        }
        files.sort();
        Ok(files)
    })
    .await??;
    if files.is_empty() {
        return Err(HandlerError::permanent("the input dir holds no files"));
    }
    let mut report = String::from("# Input report\n\n| file | bytes | lines | words |\n|---|---:|---:|---:|\n");
    let total: usize = files.iter().map(|(_, b)| b.len()).sum();
    for (name, body) in &files {
        let text = String::from_utf8_lossy(body);
        report.push_str(&format!(
            "| {name} | {} | {} | {} |\n",
            body.len(),
            text.lines().count(),
            text.split_whitespace().count()
        ));
    }
    report.push_str(&format!("\n{} files, {total} bytes\n", files.len()));
    tokio::fs::write(ctx.output("report.md"), report).await?;
    let summary = serde_json::json!({ "files": files.len(), "bytes": total });
    tokio::fs::write(ctx.output("summary.json"), summary.to_string()).await?;
    // The command's stdout: kept in the attempt's capture file.
    println!("render: {} files, {total} bytes (attempt {} of {})", files.len(), ctx.attempt, ctx.job_id);
    Ok(())
}

fn main() -> ExitCode {
    let handlers = handlers();
    // First thing: inside the worker image, this runs the handler and exits.
    stevedore::sandbox::main_hook(&handlers);
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let started = Instant::now();
    let result = rt.block_on(run(&handlers));
    let secs = started.elapsed().as_secs_f64();
    match result {
        Ok(problems) if problems.is_empty() => {
            println!("local_dev: all as expected ({secs:.1} s)");
            ExitCode::SUCCESS
        }
        Ok(problems) => {
            for p in problems {
                println!("MISMATCH: {p}");
            }
            println!("local_dev: FAILED ({secs:.1} s)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("local_dev: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Everything, in order; the mismatches found (an `Err` when it could not go on at all).
async fn run(handlers: &Handlers) -> Result<Vec<String>, String> {
    let mut problems = Vec::new();
    let worker = format!("example-local-dev-{:08x}", rand::random::<u32>());
    let base = std::path::absolute(DIR).map_err(|e| format!("{DIR}: {e}"))?;
    let input = base.join("in");
    let run_dir = base.join(format!("out-{:08x}", rand::random::<u32>()));
    let index = write_inputs(&input)?;

    // Captures next to the outputs, where a developer looks for them.
    let logs = base.join("logs");
    let rung = ContainerExecutor::connect(ContainerConfig::default().log_dir(&logs))
        .await
        .map_err(|e| format!("no engine: {}", stevedore::error_chain(&e)))?;
    let docker = common::raw_docker().await?;
    build_busybox(&docker, rung.engine()).await?;
    if let Err(e) = rung.reclaim(&worker).await {
        println!("reclaim {worker}: {e} (going on)");
    }

    // 1. This binary as a worker image, reused while the binary is the same.
    let t = Instant::now();
    let image = pack_self(rung.engine(), handlers).await?;
    println!("worker image {image} ({:.1} s)", t.elapsed().as_secs_f64());

    // 2. The handler in a container, on the input dir.
    let out = run_dir.join("render");
    let req = Request::handler("render-report", "render", &out)
        .worker(&worker)
        .image(&image)
        .fingerprint(handlers.fingerprint())
        .input_dir(&input)
        .memory(256 << 20)
        .timeout(Duration::from_secs(60));
    let t = Instant::now();
    let o = rung.run(&req, CancellationToken::new()).await.map_err(|e| launch_error("render", &e))?;
    println!(
        "render in a container: {}{} ({:.1} s)",
        o.status,
        o.reason.map(|r| format!(" ({r})")).unwrap_or_default(),
        t.elapsed().as_secs_f64()
    );
    print_where(&o, &out);
    if o.status != Status::Ok {
        problems.push(format!("render: {} {}", o.status, o.handler_error));
    }
    let names: Vec<&str> = o.outputs.iter().map(|f| f.name.as_str()).collect();
    if names != ["report.md", "summary.json"] {
        problems.push(format!("render: outputs {names:?}, expected report.md and summary.json"));
    }
    // The same handler in-process (the fast loop of local development): the same report.
    let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;
    let local = InProcessExecutor::new(handlers.clone(), stevedore::contract::incarnation::current());
    let mut local_req = req.clone();
    local_req.output_dir = scratch.path().join("out");
    println!("render in-process (same handler, this process; its stdout is ours):");
    let l = local.run(&local_req, CancellationToken::new()).await.map_err(|e| launch_error("render", &e))?;
    local.close().await;
    if l.status != Status::Ok || l.outputs != o.outputs {
        problems.push(format!("render in-process gave {} {:?}, the container {:?}", l.status, l.outputs, o.outputs));
    } else {
        println!("  the same outputs as in the container, byte for byte");
    }
    match &o.evidence.logs.stdout.path {
        Some(p) if std::fs::read_to_string(p).is_ok_and(|s| s.starts_with("render: ")) => {}
        other => problems.push(format!("render: the stdout capture {other:?} lacks the handler's line")),
    }
    rung.close().await;

    // 3. A server with a published port: fetch its page from the host, then stop it.
    problems.extend(serve(&worker, &input, &run_dir.join("serve"), &logs, &index).await?);

    let left = leftovers(&docker, &worker).await?;
    if !left.is_empty() {
        problems.push(format!("left behind in the engine for {worker}: {}", left.join(", ")));
    } else {
        println!("nothing left in the engine for worker {worker}");
    }
    Ok(problems)
}

/// Writes the input files afresh; returns the contents of `index.html`.
fn write_inputs(dir: &Path) -> Result<String, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let index = format!(
        "<!doctype html>\n<title>local dev</title>\n<p>served by busybox httpd in a stevedore attempt ({:08x})</p>\n",
        rand::random::<u32>()
    );
    let files = [
        ("index.html", index.as_str()),
        ("notes.txt", "stevedore runs each attempt\nin a fresh container\n"),
        ("data.csv", "name,value\nalpha,1\nbeta,2\n"),
    ];
    for (name, body) in files {
        std::fs::write(dir.join(name), body).map_err(|e| format!("{}: {e}", dir.join(name).display()))?;
    }
    Ok(index)
}

/// Packs this very binary into `stevedore-example/local-dev:<digest16>`, labelled with the
/// handler set's fingerprint.
async fn pack_self(engine: &stevedore::engine::Engine, handlers: &Handlers) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate own binary: {e}"))?;
    let digest = stevedore::image::bundle::exe_digest(&exe, &stevedore::image::bundle::default_base())
        .map_err(|e| format!("cannot read own binary: {e}"))?;
    let tag = format!("stevedore-example/local-dev:{}", &digest[..16.min(digest.len())]);
    let mut spec = PackSpec::new(exe, tag.clone());
    spec.fingerprint = Some(handlers.fingerprint());
    spec.labels.insert(EXAMPLE_LABEL.into(), "local-dev".into());
    let packed = ensure_image(engine, &spec).await.map_err(|e| format!("packing {tag}: {e}"))?;
    if !packed.reused {
        println!("packed {} as {tag}", spec.exe.display());
        // Every build packs a new image: the ones of earlier builds of this example go.
        let filter = format!("{EXAMPLE_LABEL}=local-dev");
        let stale = stevedore::image::stale_images(engine, std::slice::from_ref(&tag), &[filter])
            .await
            .map_err(|e| format!("listing stale images: {e}"))?;
        let removed = stevedore::image::remove_images(engine, &stale).await;
        if !removed.removed.is_empty() {
            println!("removed {} image(s) of earlier builds of this example", removed.removed.len());
        }
    }
    Ok(tag)
}

/// Runs `httpd` on the input dir with its port published on the host, fetches `/` while it
/// runs, then cancels it. The mismatches found.
async fn serve(worker: &str, input: &Path, out: &Path, logs: &Path, index: &str) -> Result<Vec<String>, String> {
    let mut problems = Vec::new();
    // A free host port, given explicitly so that it is known while the server runs.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let config = ContainerConfig::default().name("web").network("bridge").publish(SERVER_PORT, port).log_dir(logs);
    let rung = ContainerExecutor::connect(config).await.map_err(|e| launch_error("serve", &e))?;
    let host = if rung.engine().endpoint().is_local() {
        "127.0.0.1".to_owned()
    } else {
        rung.engine().endpoint().host.clone().unwrap_or_else(|| "127.0.0.1".into())
    };
    let addr = format!("{host}:{port}");
    let port_arg = SERVER_PORT.to_string();
    let req = Request::command("serve-in", ["httpd", "-f", "-v", "-p", port_arg.as_str(), "-h", "/in"], out)
        .worker(worker)
        .image(BUSYBOX_IMAGE)
        .input_dir(input)
        .grace(Duration::from_secs(2))
        // A bound in case nobody stops it.
        .timeout(Duration::from_secs(60));
    let cancel = CancellationToken::new();
    let server = tokio::spawn({
        let (rung, cancel) = (rung.clone(), cancel.clone());
        async move { rung.run(&req, cancel).await }
    });

    let t = Instant::now();
    let fetched = fetch_until(&addr, Duration::from_secs(20), &server).await;
    cancel.cancel();
    let outcome = server.await.map_err(|e| format!("the server task: {e}"))?;
    rung.close().await;
    let o = outcome.map_err(|e| launch_error("serve", &e))?;
    match fetched {
        Ok((status, body)) => {
            println!(
                "GET http://{addr}/ -> {status} ({} bytes, {:.1} s after the start)",
                body.len(),
                t.elapsed().as_secs_f64()
            );
            if !status.contains(" 200 ") {
                problems.push(format!("serve: {status}"));
            }
            if body != index.as_bytes() {
                problems.push(format!("serve: the page is {:?}, expected index.html", String::from_utf8_lossy(&body)));
            }
        }
        Err(e) => problems.push(format!("serve: no page from http://{addr}/: {e}")),
    }
    println!("server stopped: {}{}", o.status, o.reason.map(|r| format!(" ({r})")).unwrap_or_default());
    print_where(&o, out);
    if (o.status, o.reason) != (Status::Killed, Some(Reason::Cancelled)) {
        problems.push(format!("serve: ended {} {:?}, expected killed (cancelled)", o.status, o.reason));
    }
    let access_log = o.evidence.logs.stderr.path.as_ref().and_then(|p| std::fs::read_to_string(p).ok());
    match access_log.as_deref().and_then(|log| log.lines().find(|l| l.contains("response:200"))) {
        Some(line) => println!("  httpd's log: {line}"),
        None => problems.push(format!("serve: no \"response:200\" in httpd's stderr capture: {access_log:?}")),
    }
    let published = o.evidence.ports.get(&format!("{SERVER_PORT}/tcp"));
    if published != Some(&addr) {
        problems.push(format!("serve: evidence.ports {:?}, expected {SERVER_PORT}/tcp at {addr}", o.evidence.ports));
    }
    Ok(problems)
}

/// GETs `/` from `addr` until a full HTTP answer arrives, the deadline passes or the server
/// attempt ends. (Right after the start, the engine's proxy may accept a connection and
/// close it before the server listens.)
async fn fetch_until<T>(
    addr: &str,
    within: Duration,
    server: &tokio::task::JoinHandle<T>,
) -> Result<(String, Vec<u8>), String> {
    let deadline = Instant::now() + within;
    let mut last = String::from("nothing tried");
    while Instant::now() < deadline {
        if server.is_finished() {
            return Err(format!("the server attempt ended first (last try: {last})"));
        }
        match get(addr).await {
            Ok(answer) => return Ok(answer),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("no answer within {within:?} (last try: {last})"))
}

/// One `GET /` over HTTP/1.0: the status line and the body.
async fn get(addr: &str) -> Result<(String, Vec<u8>), String> {
    let io = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET / HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(3), io)
        .await
        .map_err(|_| "no answer within 3 s".to_owned())?
        .map_err(|e| e.to_string())?;
    let split = answer.windows(4).position(|w| w == b"\r\n\r\n").ok_or("an empty or partial answer")?;
    let head = String::from_utf8_lossy(&answer[..split]);
    let status = head.lines().next().unwrap_or("").to_owned();
    if !status.starts_with("HTTP/") {
        return Err(format!("not HTTP: {status:?}"));
    }
    Ok((status, answer[split + 4..].to_vec()))
}

/// Where an attempt's outputs and captures are.
fn print_where(o: &Outcome, out: &Path) {
    println!("  outputs in {}", out.display());
    for f in &o.outputs {
        println!("    {:<14} {:>6} bytes  {}", f.name, f.size, &f.hash[..f.hash.len().min(23)]);
    }
    let show = |p: &Option<String>| p.clone().unwrap_or_else(|| "(not kept)".into());
    println!("  stdout: {}", show(&o.evidence.logs.stdout.path));
    println!("  stderr: {}", show(&o.evidence.logs.stderr.path));
}

fn launch_error(what: &str, e: &LaunchError) -> String {
    format!("{what}: the attempt did not run: {}", stevedore::error_chain(e))
}
