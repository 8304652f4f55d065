//! An engine in memory, for unit tests of everything the rungs do with an engine: which
//! objects exist, which calls were made, failures injected at any call, and a scripted
//! init behind `attach`/`start` that speaks the link as the real one does.

use super::api::{Attached, ByteStream, Call, Chunk, ContainerState, EngineApi, ImageFacts, Listed, Removal};
use super::client::{Engine, EngineFacts};
use super::error::EngineError;
use bollard::models::{ContainerCreateBody, VolumeCreateRequest};
use bytes::Bytes;
use futures_util::StreamExt;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, DuplexStream};
use tokio::sync::mpsc;

/// What the scripted init gets when the container starts: the bytes the host writes (its
/// stdin) and a sender for what it writes (stdout/stderr).
pub(crate) struct InitSide {
    pub stdin: DuplexStream,
    pub out: mpsc::UnboundedSender<std::io::Result<Chunk>>,
    /// The container's name.
    pub name: String,
    pub engine: Arc<FakeApi>,
}

/// A scripted init: runs as a task when the container starts.
pub(crate) type Script = Arc<dyn Fn(InitSide) -> futures_util::future::BoxFuture<'static, ()> + Send + Sync>;

#[derive(Debug, Default, Clone)]
pub(crate) struct FakeContainer {
    pub labels: HashMap<String, String>,
    /// Volume → mount point.
    pub mounts: Vec<(String, String)>,
    pub started: bool,
    pub exit_code: Option<i64>,
    pub oom_killed: Option<bool>,
}

#[derive(Default)]
struct State {
    images: HashMap<String, ImageFacts>,
    containers: BTreeMap<String, FakeContainer>,
    volumes: BTreeMap<String, Listed>,
    /// Volumes something was uploaded into (an empty one holds no init to start).
    filled: std::collections::HashSet<String>,
    calls: Vec<String>,
    /// op → how many more calls of it succeed before one fails (then the failure is removed).
    fail: HashMap<&'static str, (usize, u16)>,
    /// op → after how many more successes, how many calls in a row fail with that status.
    fail_times: HashMap<&'static str, (usize, usize, u16)>,
    /// Ops that are done, then answered as a timeout (the engine was slow to say so).
    late: std::collections::HashSet<&'static str>,
    /// (op, object) → the status every such call fails with.
    /// What was uploaded into each volume (the tar, as sent).
    /// Per container: the stdin to hand to the script at start, and the output sender.
    pending: HashMap<String, (DuplexStream, mpsc::UnboundedSender<std::io::Result<Chunk>>)>,
}

/// The fake's calls.
pub(crate) struct FakeApi {
    state: Mutex<State>,
    script: Mutex<Option<Script>>,
    me: Mutex<Option<std::sync::Weak<FakeApi>>>,
    /// While set, uploads wait until it is closed (an upload the engine is slow to take).
    upload_gate: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
    /// The engine went away (`lose`): pings fail, watch streams end.
    lost: tokio::sync::watch::Sender<bool>,
}

impl std::fmt::Debug for FakeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FakeApi")
    }
}

impl FakeApi {
    /// A fake with `image` present.
    pub fn new(image: &str) -> Arc<Self> {
        let api = Arc::new(Self {
            state: Mutex::default(),
            script: Mutex::new(None),
            me: Mutex::new(None),
            upload_gate: Mutex::new(None),
            lost: tokio::sync::watch::Sender::new(false),
        });
        *api.me.lock().unwrap() = Some(Arc::downgrade(&api));
        api.state.lock().unwrap().images.insert(
            image.to_owned(),
            ImageFacts { id: format!("sha256:{image}"), architecture: "amd64".into(), ..ImageFacts::default() },
        );
        api
    }

    /// An engine over this fake.
    pub fn engine(self: &Arc<Self>) -> Engine {
        let facts = EngineFacts {
            product: "Fake Engine".into(),
            engine_version: "0".into(),
            api_version: "1.41".into(),
            cgroup_version: "2".into(),
            ncpu: 2,
            mem_total_bytes: 8 << 30,
            os_type: "linux".into(),
            architecture: crate::sandbox::init_binary::arch().into(),
            ..EngineFacts::default()
        };
        Engine::with_api(self.clone(), facts, Duration::from_secs(5))
    }

    /// The engine goes away: its event streams end and pings fail until [`Self::restore`]
    /// (the other calls still work, so that what the attempt made can be looked at).
    pub fn lose(&self) {
        self.lost.send_replace(true);
    }

    /// The engine is back.
    pub fn restore(&self) {
        self.lost.send_replace(false);
    }

    /// Makes uploads wait until [`Self::release_uploads`].
    pub fn hold_uploads(&self) {
        *self.upload_gate.lock().unwrap() = Some(Arc::new(tokio::sync::Semaphore::new(0)));
    }

    /// Lets held and later uploads through.
    pub fn release_uploads(&self) {
        if let Some(g) = self.upload_gate.lock().unwrap().take() {
            g.close();
        }
    }

    /// Sets the init's behaviour for containers started from now on.
    pub fn script(&self, s: Script) {
        *self.script.lock().unwrap() = Some(s);
    }

    /// Makes the call `op` fail with `status` after `after` more successful ones.
    pub fn fail(&self, op: &'static str, after: usize, status: u16) {
        self.state.lock().unwrap().fail.insert(op, (after, status));
    }

    /// Makes `times` calls of `op` in a row fail with `status`, after `after` more successes.
    pub fn fail_times(&self, op: &'static str, after: usize, times: usize, status: u16) {
        self.state.lock().unwrap().fail_times.insert(op, (after, times, status));
    }

    /// Makes `op` do its work, then answer with a timeout (once).
    pub fn answer_late(&self, op: &'static str) {
        self.state.lock().unwrap().late.insert(op);
    }

    /// Whether `op` is to be answered late (and no longer, once asked).
    fn late(&self, op: &'static str) -> bool {
        self.state.lock().unwrap().late.remove(op)
    }

    /// The volumes that exist.
    pub fn volume_names(&self) -> Vec<String> {
        self.state.lock().unwrap().volumes.keys().cloned().collect()
    }

    /// The calls made so far, as `op name`.
    pub fn calls(&self) -> Vec<String> {
        self.state.lock().unwrap().calls.clone()
    }

    /// The containers and volumes that exist (after `close()`: what leaked).
    pub fn objects(&self) -> Vec<String> {
        let s = self.state.lock().unwrap();
        s.containers.keys().chain(s.volumes.keys()).cloned().collect()
    }

    /// Sets a container's state as the engine would report it after its end.
    pub fn set_exit(&self, name: &str, code: i64, oom: bool) {
        if let Some(c) = self.state.lock().unwrap().containers.get_mut(name) {
            c.exit_code = Some(code);
            c.oom_killed = Some(oom);
        }
    }

    /// Adds a label to an image.
    pub fn label_image(&self, image: &str, key: &str, value: &str) {
        if let Some(i) = self.state.lock().unwrap().images.get_mut(image) {
            i.labels.insert(key.to_owned(), value.to_owned());
        }
    }

    /// Removes a container behind stevedore's back.
    pub fn remove_externally(&self, name: &str) {
        self.state.lock().unwrap().containers.remove(name);
    }

    fn enter(&self, op: &'static str, what: &str) -> Result<(), EngineError> {
        let mut s = self.state.lock().unwrap();
        s.calls.push(format!("{op} {what}"));
        if let Some((after, times, status)) = s.fail_times.get(op).copied().filter(|(_, n, _)| *n > 0) {
            if after == 0 {
                s.fail_times.insert(op, (0, times - 1, status));
                return Err(EngineError::Refused { op, status, message: format!("injected failure of {op}") });
            }
            s.fail_times.insert(op, (after - 1, times, status));
        }
        if let Some((after, status)) = s.fail.get(op).copied() {
            if after == 0 {
                s.fail.remove(op);
                return Err(EngineError::Refused { op, status, message: format!("injected failure of {op}") });
            }
            s.fail.insert(op, (after - 1, status));
        }
        Ok(())
    }

    fn not_found(op: &'static str, what: &str) -> EngineError {
        EngineError::Refused { op, status: 404, message: format!("no such object: {what}") }
    }

    fn not_faked(op: &'static str, what: &str) -> EngineError {
        EngineError::Refused { op, status: 501, message: format!("the fake engine does not do this: {what}") }
    }
}

impl EngineApi for FakeApi {
    fn ping(&self) -> Call<'_, ()> {
        Box::pin(async move {
            self.enter("ping", "")?;
            if *self.lost.borrow() {
                return Err(EngineError::Timeout { op: "ping", after: Duration::from_secs(5) });
            }
            Ok(())
        })
    }

    fn watch(&self) -> super::api::Watch {
        let mut lost = self.lost.subscribe();
        Box::pin(
            futures_util::stream::once(async move {
                let _ = lost.wait_for(|l| *l).await;
            })
            .filter_map(|()| std::future::ready(None)),
        )
    }

    fn inspect_image<'a>(&'a self, image: &'a str) -> Call<'a, ImageFacts> {
        Box::pin(async move {
            self.enter("inspect image", image)?;
            self.state.lock().unwrap().images.get(image).cloned().ok_or_else(|| Self::not_found("inspect image", image))
        })
    }

    fn pull<'a>(&'a self, image: &'a str, _auth: Option<&'a crate::engine::credentials::RegistryAuth>) -> Call<'a, ()> {
        Box::pin(async move {
            self.enter("pull image", image)?;
            Err(EngineError::Refused { op: "pull image", status: 500, message: "no registry".into() })
        })
    }

    fn create_volume(&self, req: VolumeCreateRequest) -> Call<'_, Listed> {
        Box::pin(async move {
            let name = req.name.clone().unwrap_or_default();
            self.enter("create volume", &name)?;
            let mut s = self.state.lock().unwrap();
            let v = s.volumes.entry(name.clone()).or_insert_with(|| Listed {
                id: name.clone(),
                name: name.clone(),
                labels: req.labels.clone().unwrap_or_default(),
            });
            Ok(v.clone())
        })
    }

    fn inspect_volume<'a>(&'a self, name: &'a str) -> Call<'a, Option<Listed>> {
        Box::pin(async move {
            self.enter("inspect volume", name)?;
            Ok(self.state.lock().unwrap().volumes.get(name).cloned())
        })
    }

    fn remove_volume<'a>(&'a self, name: &'a str) -> Call<'a, ()> {
        Box::pin(async move {
            self.enter("remove volume", name)?;
            let mut s = self.state.lock().unwrap();
            // As the engine: a volume a container mounts is not removed.
            if s.containers.values().any(|c| c.mounts.iter().any(|(v, _)| v == name)) {
                return Err(EngineError::Refused {
                    op: "remove volume",
                    status: 409,
                    message: "volume is in use".into(),
                });
            }
            s.volumes.remove(name);
            s.filled.remove(name);
            Ok(())
        })
    }

    fn list_volumes(&self, filters: HashMap<String, Vec<String>>) -> Call<'_, Vec<Listed>> {
        Box::pin(async move {
            self.enter("list volumes", "")?;
            let s = self.state.lock().unwrap();
            Ok(s.volumes.values().filter(|v| matches(&v.labels, &filters)).cloned().collect())
        })
    }

    fn create_container<'a>(&'a self, name: &'a str, body: ContainerCreateBody) -> Call<'a, String> {
        Box::pin(async move {
            self.enter("create container", name)?;
            let mut s = self.state.lock().unwrap();
            if s.containers.contains_key(name) {
                return Err(EngineError::Refused {
                    op: "create container",
                    status: 409,
                    message: "name in use".into(),
                });
            }
            let image = body.image.clone().unwrap_or_default();
            if !s.images.contains_key(&image) && !s.images.values().any(|i| i.id == image) {
                return Err(Self::not_found("create container", &image));
            }
            let labels = body.labels.clone().unwrap_or_default();
            let all = body.host_config.as_ref().and_then(|h| h.mounts.clone()).unwrap_or_default();
            // As the engine: a named volume that does not exist is created, empty, with the
            // labels of the mount's volume options.
            for m in &all {
                if m.typ == Some(bollard::models::MountType::VOLUME)
                    && let Some(v) = &m.source
                    && !s.volumes.contains_key(v)
                {
                    let labels = m.volume_options.as_ref().and_then(|o| o.labels.clone()).unwrap_or_default();
                    s.volumes.insert(v.clone(), Listed { id: v.clone(), name: v.clone(), labels });
                }
            }
            let mounts = all.into_iter().filter_map(|m| Some((m.source?, m.target?))).collect();
            s.containers.insert(name.to_owned(), FakeContainer { labels, mounts, ..FakeContainer::default() });
            Ok(format!("id-{name}"))
        })
    }

    fn remove_container<'a>(&'a self, name: &'a str) -> Call<'a, Removal> {
        Box::pin(async move {
            self.enter("remove container", name)?;
            // By name or by the id `list_containers` gives, as the engine takes either.
            let name = name.strip_prefix("id-").unwrap_or(name);
            let mut s = self.state.lock().unwrap();
            s.pending.remove(name);
            Ok(if s.containers.remove(name).is_some() { Removal::Removed } else { Removal::ByOthers })
        })
    }

    fn list_containers(&self, filters: HashMap<String, Vec<String>>) -> Call<'_, Vec<Listed>> {
        Box::pin(async move {
            self.enter("list containers", "")?;
            let s = self.state.lock().unwrap();
            Ok(s.containers
                .iter()
                .filter(|(_, c)| matches(&c.labels, &filters))
                .map(|(n, c)| Listed { id: format!("id-{n}"), name: n.clone(), labels: c.labels.clone() })
                .collect())
        })
    }

    fn attach<'a>(&'a self, name: &'a str) -> Call<'a, Attached> {
        Box::pin(async move {
            // By name or by id, as the engine takes either.
            let name = name.strip_prefix("id-").unwrap_or(name);
            self.enter("attach container", name)?;
            let (host_in, init_in) = tokio::io::duplex(1 << 20);
            let (tx, rx) = mpsc::unbounded_channel();
            self.state.lock().unwrap().pending.insert(name.to_owned(), (init_in, tx));
            let output = tokio_stream_from(rx);
            Ok(Attached { output, input: Box::pin(host_in) })
        })
    }

    fn update<'a>(&'a self, name: &'a str, _memory: u64, _cpus: Option<u64>, _pids: u64) -> Call<'a, ()> {
        let name = name.strip_prefix("id-").unwrap_or(name);
        Box::pin(async move { self.enter("update container", name) })
    }

    fn wait_exit<'a>(&'a self, name: &'a str) -> Call<'a, i64> {
        Box::pin(async move {
            // By name or by id, as the engine takes either.
            let name = name.strip_prefix("id-").unwrap_or(name);
            self.enter("wait container", name)?;
            Ok(0)
        })
    }

    fn exec<'a>(&'a self, name: &'a str, _argv: Vec<String>, _user: Option<&'a str>) -> Call<'a, Attached> {
        Box::pin(async move {
            // By name or by id, as the engine takes either.
            let name = name.strip_prefix("id-").unwrap_or(name);
            self.enter("create exec", name)?;
            Err(EngineError::Refused { op: "create exec", status: 501, message: "the fake engine has no exec".into() })
        })
    }

    fn start<'a>(&'a self, name: &'a str) -> Call<'a, ()> {
        Box::pin(async move {
            // By name or by id, as the engine takes either.
            let name = name.strip_prefix("id-").unwrap_or(name);
            self.enter("start container", name)?;
            let (stdin, out) = {
                let mut s = self.state.lock().unwrap();
                let c = s.containers.get(name).ok_or_else(|| Self::not_found("start container", name))?;
                let tools =
                    c.mounts.iter().find(|(_, at)| at == stevedore_init::wire::TOOLS_DIR).map(|(v, _)| v.clone());
                if tools.is_some_and(|v| !s.filled.contains(&v)) {
                    return Err(EngineError::Refused {
                        op: "start container",
                        status: 400,
                        message: "exec: \"/.stevedore/tools/stevedore-init\": no such file or directory".into(),
                    });
                }
                let c = s.containers.get_mut(name).ok_or_else(|| Self::not_found("start container", name))?;
                c.started = true;
                s.pending.remove(name).ok_or_else(|| Self::not_found("start container", name))?
            };
            let script = self.script.lock().unwrap().clone().expect("a scripted init");
            let engine = self.me.lock().unwrap().as_ref().and_then(std::sync::Weak::upgrade).expect("alive");
            tokio::spawn(script(InitSide { stdin, out, name: name.to_owned(), engine }));
            if self.late("start container") {
                return Err(EngineError::Timeout { op: "start container", after: Duration::from_secs(1) });
            }
            Ok(())
        })
    }

    fn kill<'a>(&'a self, name: &'a str, signal: &'a str) -> Call<'a, ()> {
        let name = name.strip_prefix("id-").unwrap_or(name);
        Box::pin(async move { self.enter("kill container", &format!("{name} {signal}")) })
    }

    fn inspect_container<'a>(&'a self, name: &'a str) -> Call<'a, ContainerState> {
        Box::pin(async move {
            // By name or by id, as the engine takes either.
            let name = name.strip_prefix("id-").unwrap_or(name);
            self.enter("inspect container", name)?;
            let s = self.state.lock().unwrap();
            let c = s.containers.get(name).ok_or_else(|| Self::not_found("inspect container", name))?;
            Ok(ContainerState {
                running: c.started && c.exit_code.is_none(),
                exit_code: c.exit_code,
                oom_killed: c.oom_killed,
                ..ContainerState::default()
            })
        })
    }

    fn stat_path<'a>(&'a self, name: &'a str, path: &'a str) -> Call<'a, super::api::PathKind> {
        Box::pin(async move {
            // By name or by id, as the engine takes either.
            let name = name.strip_prefix("id-").unwrap_or(name);
            self.enter("stat path", &format!("{name} {path}"))?;
            let s = self.state.lock().unwrap();
            s.containers.get(name).ok_or_else(|| Self::not_found("stat path", name))?;
            // The fake's images hold nothing: every path is made by the engine at start.
            Ok(super::api::PathKind::Missing)
        })
    }

    fn upload<'a>(&'a self, name: &'a str, path: &'a str, mut tar: ByteStream, _timeout: Duration) -> Call<'a, ()> {
        Box::pin(async move {
            // By name or by id, as the engine takes either.
            let name = name.strip_prefix("id-").unwrap_or(name);
            self.enter("upload archive", &format!("{name} {path}"))?;
            let gate = self.upload_gate.lock().unwrap().clone();
            if let Some(g) = gate {
                // Closed on release: the wait ends then.
                let _ = g.acquire().await;
            }
            {
                let mut s = self.state.lock().unwrap();
                let into = s.containers.get(name).and_then(|c| c.mounts.iter().find(|(_, at)| at == path)).cloned();
                if let Some((volume, _)) = into {
                    s.filled.insert(volume);
                }
            }
            // Read whole, as the engine does; the fake keeps nothing of it.
            while let Some(chunk) = tar.next().await {
                chunk.map_err(|e| EngineError::Refused {
                    op: "upload archive",
                    status: 500,
                    message: e.to_string(),
                })?;
            }
            Ok(())
        })
    }

    // The rungs never touch images beyond `inspect_image`: packing is tested on real engines.
    #[cfg(feature = "oci")]
    fn export(&self, name: &str) -> super::api::ByteStream {
        let e = std::io::Error::other(Self::not_faked("export container", name).to_string());
        Box::pin(futures_util::stream::once(std::future::ready(Err(e))))
    }

    fn image_info<'a>(&'a self, reference: &'a str) -> Call<'a, Option<super::api::ImageInfo>> {
        Box::pin(async move { Err(Self::not_faked("inspect image", reference)) })
    }

    fn list_images(&self, _: HashMap<String, Vec<String>>) -> Call<'_, Vec<super::api::ImageInfo>> {
        Box::pin(async move { Err(Self::not_faked("list images", "")) })
    }

    fn images_in_use(&self) -> Call<'_, std::collections::HashSet<String>> {
        Box::pin(async move { Err(Self::not_faked("list containers", "")) })
    }

    fn remove_image<'a>(&'a self, name: &'a str) -> Call<'a, ()> {
        Box::pin(async move { Err(Self::not_faked("remove image", name)) })
    }

    fn import_image<'a>(
        &'a self,
        reference: &'a str,
        _: super::api::ByteStream,
        _: Vec<String>,
    ) -> Call<'a, super::api::Built> {
        Box::pin(async move { Err(Self::not_faked("import image", reference)) })
    }

    fn build_image<'a>(&'a self, tag: &'a str, _: Vec<u8>) -> Call<'a, super::api::Built> {
        Box::pin(async move { Err(Self::not_faked("build image", tag)) })
    }
}

fn tokio_stream_from(
    mut rx: mpsc::UnboundedReceiver<std::io::Result<Chunk>>,
) -> std::pin::Pin<Box<dyn futures_util::Stream<Item = std::io::Result<Chunk>> + Send>> {
    Box::pin(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}

/// Whether `labels` pass the engine's `label=` filters.
fn matches(labels: &HashMap<String, String>, filters: &HashMap<String, Vec<String>>) -> bool {
    filters.get("label").is_none_or(|fs| {
        fs.iter().all(|f| match f.split_once('=') {
            Some((k, v)) => labels.get(k).map(String::as_str) == Some(v),
            None => labels.contains_key(f.as_str()),
        })
    })
}

/// Reads the Start frame the host sent to a scripted init.
pub(crate) async fn read_start(stdin: &mut DuplexStream) -> (stevedore_init::wire::Start, Vec<u8>) {
    let mut d = stevedore_init::wire::Decoder::new(|_| true);
    let mut buf = vec![0u8; 64 << 10];
    loop {
        if let Some(f) = d.next_frame().expect("frames") {
            if f.kind == stevedore_init::wire::Kind::Start {
                return stevedore_init::wire::decode_start(&f.body).expect("a valid start");
            }
            continue;
        }
        let n = stdin.read(&mut buf).await.expect("stdin");
        assert!(n > 0, "the host closed stdin before the start");
        d.feed(&buf[..n]);
    }
}

/// Reads host frames until an Ack (true) or the end of stdin (false).
pub(crate) async fn await_ack(stdin: &mut DuplexStream) -> bool {
    let mut d = stevedore_init::wire::Decoder::new(|_| true);
    let mut buf = vec![0u8; 4096];
    loop {
        while let Ok(Some(f)) = d.next_frame() {
            if f.kind == stevedore_init::wire::Kind::Ack {
                return true;
            }
        }
        match stdin.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => d.feed(&buf[..n]),
        }
    }
}

/// Sends one link frame as the init's stdout.
pub(crate) fn send(out: &mpsc::UnboundedSender<std::io::Result<Chunk>>, kind: stevedore_init::wire::Kind, body: &[u8]) {
    let _ = out.send(Ok(Chunk::Stdout(Bytes::from(stevedore_init::wire::encode(kind, body)))));
}
