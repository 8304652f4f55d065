//! The built-in handlers of the `stevedore` binary, for smoke tests, demos and the rungs'
//! own tests.

use super::{HandlerContext, HandlerError, Handlers};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The handlers built into the `stevedore` binary. Their fingerprint includes the crate
/// version, since their behaviour may change between releases.
///
/// | name | does |
/// |---|---|
/// | `true` | nothing, successfully |
/// | `echo` | writes the payload to `<out>/payload` |
/// | `write-outputs` | writes `<out>/a.txt` (`alpha\n`) and `<out>/dir/b.json` (`{"b":1}`) |
/// | `fail` | fails with the payload as text, or `failed` |
/// | `fail-permanent` | fails permanently, likewise |
/// | `panic` | panics |
/// | `sleep` | sleeps payload ms; fails with `cancelled` when cancelled |
/// | `ignore-cancel` | sleeps payload ms in a blocking thread, ignoring cancellation |
/// | `env` | writes its process environment, sorted `KEY=VALUE` lines, to `<out>/env.txt` |
/// | `inputs` | writes `<slot> sha256:<hex>` lines to `<out>/inputs.txt` |
/// | `alloc` | allocates payload bytes, touches every page, holds them 200 ms |
/// | `cat-input` | copies input slot `in` to `<out>/copy` |
/// | `progress` | reports progress 25, 50, 75 (the payload as text), writes `<out>/reported` |
pub fn builtin() -> Handlers {
    Handlers::new()
        .with_version(concat!("stevedore ", env!("CARGO_PKG_VERSION")))
        .register("true", |_| async { Ok(()) })
        .register("echo", |ctx| async move { write(&ctx.output("payload"), &ctx.payload).await })
        .register("write-outputs", |ctx| async move {
            write(&ctx.output("a.txt"), b"alpha\n").await?;
            write(&ctx.output("dir/b.json"), br#"{"b":1}"#).await
        })
        .register("progress", |ctx| async move {
            let text = (!ctx.payload.is_empty()).then(|| ctx.payload_text().into_owned());
            let taken: Vec<String> =
                [25.0, 50.0, 75.0].iter().map(|p| ctx.progress(*p, text.as_deref()).to_string()).collect();
            write(&ctx.output("reported"), taken.join(" ").as_bytes()).await
        })
        .register("fail", |ctx| async move { Err(HandlerError::new(text_or(&ctx, "failed"))) })
        .register(
            "fail-permanent",
            |ctx| async move { Err(HandlerError::permanent(text_or(&ctx, "failed permanently"))) },
        )
        .register("panic", |ctx| async move { panic!("{}", text_or(&ctx, "the panic handler panicked")) })
        .register("sleep", |ctx| async move {
            let d = millis(&ctx)?;
            tokio::select! {
                () = tokio::time::sleep(d) => Ok(()),
                () = ctx.cancel.cancelled() => Err(HandlerError::new("cancelled")),
            }
        })
        .register("ignore-cancel", |ctx| async move {
            let d = millis(&ctx)?;
            tokio::task::spawn_blocking(move || std::thread::sleep(d)).await?;
            Ok(())
        })
        .register("env", |ctx| async move {
            let mut vars: Vec<String> = std::env::vars_os()
                .map(|(k, v)| format!("{}={}\n", k.to_string_lossy(), v.to_string_lossy()))
                .collect();
            vars.sort();
            write(&ctx.output("env.txt"), vars.concat().as_bytes()).await
        })
        .register("inputs", |ctx| async move {
            let mut lines = String::new();
            for (slot, path) in &ctx.inputs {
                lines.push_str(&format!("{slot} {}\n", sha256_file(path.clone()).await?));
            }
            write(&ctx.output("inputs.txt"), lines.as_bytes()).await
        })
        .register("alloc", |ctx| async move {
            let n: usize = parse_payload(&ctx, "a number of bytes")?;
            let held = tokio::task::spawn_blocking(move || touch_pages(n)).await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
            drop(held);
            Ok(())
        })
        .register("cat-input", |ctx| async move {
            let src = ctx.input("in").ok_or_else(|| HandlerError::permanent("no input slot \"in\""))?;
            tokio::fs::copy(src, ctx.output("copy"))
                .await
                .map_err(|e| HandlerError::context(format!("copying {}", src.display()), e))?;
            Ok(())
        })
}

fn text_or(ctx: &HandlerContext, default: &str) -> String {
    if ctx.payload.is_empty() { default.to_owned() } else { ctx.payload_text().into_owned() }
}

fn parse_payload<T: std::str::FromStr>(ctx: &HandlerContext, what: &str) -> Result<T, HandlerError> {
    let text = ctx.payload_text();
    text.trim().parse().map_err(|_| HandlerError::permanent(format!("payload must be {what}, got {:?}", text.trim())))
}

fn millis(ctx: &HandlerContext) -> Result<Duration, HandlerError> {
    parse_payload(ctx, "a number of milliseconds").map(Duration::from_millis)
}

async fn write(path: &Path, bytes: &[u8]) -> Result<(), HandlerError> {
    if let Some(parent) = path.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| HandlerError::context(format!("creating {}", parent.display()), e))?;
    }
    tokio::fs::write(path, bytes).await.map_err(|e| HandlerError::context(format!("writing {}", path.display()), e))
}

async fn sha256_file(path: PathBuf) -> Result<String, HandlerError> {
    tokio::task::spawn_blocking(move || {
        let file =
            std::fs::File::open(&path).map_err(|e| HandlerError::context(format!("opening {}", path.display()), e))?;
        crate::outputs::hash_reader(file, 0)
            .map(|h| h.hash)
            .map_err(|e| HandlerError::context(format!("reading {}", path.display()), e))
    })
    .await?
}

fn touch_pages(n: usize) -> Vec<u8> {
    // A zeroed allocation may be mapped lazily: writing one byte per page makes the
    // memory resident, which is what the OOM tests need.
    let mut v = vec![0u8; n];
    for i in (0..n).step_by(4096) {
        v[i] = 1;
    }
    std::hint::black_box(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::sync::CancellationToken;

    fn ctx(out: &Path, payload: &str) -> HandlerContext {
        HandlerContext {
            job_id: "j".into(),
            attempt: 1,
            payload: payload.into(),
            input_dir: PathBuf::new(),
            output_dir: out.to_path_buf(),
            inputs: Default::default(),
            prior_outputs: Vec::new(),
            deadline: None,
            cancel: CancellationToken::new(),
            reporter: crate::handlers::Reporter::none(),
        }
    }

    async fn call(name: &str, c: HandlerContext) -> Result<(), HandlerError> {
        builtin().get(name).unwrap()(c).await
    }

    #[test]
    fn the_documented_set() {
        let names = builtin().names().join(" ");
        assert_eq!(
            names,
            "alloc cat-input echo env fail fail-permanent ignore-cancel inputs panic progress sleep true write-outputs"
        );
    }

    #[tokio::test]
    async fn env_is_sorted_lines() {
        let t = tempfile::tempdir().unwrap();
        call("env", ctx(t.path(), "")).await.unwrap();
        let text = std::fs::read_to_string(t.path().join("env.txt")).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert!(lines.is_sorted() && lines.iter().all(|l| l.contains('=')));
    }

    #[tokio::test]
    async fn alloc_and_sleep() {
        let t = tempfile::tempdir().unwrap();
        call("alloc", ctx(t.path(), "1048576")).await.unwrap();
        call("sleep", ctx(t.path(), "1")).await.unwrap();
        let c = ctx(t.path(), "60000");
        c.cancel.cancel();
        assert_eq!(call("sleep", c).await.unwrap_err().message, "cancelled");
        let e = call("sleep", ctx(t.path(), "soon")).await.unwrap_err();
        assert!(e.permanent && e.message.contains("milliseconds"), "{e}");
    }

    #[tokio::test]
    async fn cat_input_without_slot_is_permanent() {
        let t = tempfile::tempdir().unwrap();
        assert!(call("cat-input", ctx(t.path(), "")).await.unwrap_err().permanent);
    }
}
