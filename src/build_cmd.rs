//! `brig image build`: runs a recipe (crates/brig-image/src/recipe.rs).
//!
//! A Debian base is made by debootstrap on the host; every later step runs as
//! root in a sandbox on the image so far (the build id mapping, so package
//! managers' ownership is real, and the host network, for downloads), and what it
//! wrote becomes one layer. Only the finished image is recorded: a failed or
//! interrupted build leaves at most unreferenced layers, which `brig image gc`
//! removes.
//!
//! The layers made so far stay locked (as a running sandbox's are) from their
//! commit to the end, so a concurrent gc cannot take them, without holding the
//! store lock, which would stall gc, for the whole build.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use brig_image::pack::{PackOptions, MKFS};
use brig_image::recipe::{debian_sources, debootstrap_command, Base, Recipe, Step};
use brig_image::store::{now_unix, validate_name, ImageRecord, LayersInUse, Store, WorkDir};
use brig_image::{ImageConfig, ImageError, IoContext, Progress};
use brig_policy::{BindMount, IdMapping, Limits, NetworkMode, SandboxSpec};

use crate::image_cmd::human_bytes;

/// Per build step. Downloads and compiles can be slow; a hung step still ends.
const STEP_TIMEOUT: Duration = Duration::from_secs(60 * 60);
/// What a step may write: its upper layer is a tmpfs of this size.
const STEP_DISK_BYTES: u64 = 8 << 30;
/// The tmpfs is charged to the sandbox's memory, so this must exceed the disk
/// size by what the step's processes themselves need.
const STEP_MEMORY_BYTES: u64 = 10 << 30;
const STEP_PIDS: u64 = 4096;
const STEP_NOFILE: u64 = 8192;
/// Captured output per stream, kept for the error message of a failed step.
const STEP_OUTPUT_BYTES: u64 = 16 << 20;
/// Lines of a failed step's output quoted in its error.
const TAIL_LINES: usize = 3;
/// Where build steps find the host's CA bundle: in the sandbox's scratch /tmp, so
/// it never lands in a layer.
const HOST_CA_TARGET: &str = "/tmp/brig-host-ca.crt";
/// Variables that point TLS clients (OpenSSL, pip, requests, curl) at a CA bundle.
const CA_VARIABLES: [&str; 4] = [
    "SSL_CERT_FILE",
    "PIP_CERT",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
];

pub fn build(
    store: &Store,
    name: &str,
    recipe_path: &Path,
    replace: bool,
    progress: &dyn Progress,
) -> Result<ImageRecord, ImageError> {
    // Everything that can be checked is checked before any work, so a mistake
    // costs nothing and changes nothing.
    validate_name(name)?;
    if !replace && store.has_image(name) {
        return Err(ImageError::ImageExists(name.to_string()));
    }
    let recipe = Recipe::load(recipe_path)?;
    let (base_image, tools) = match &recipe.base {
        Base::Image(base) => {
            let record = store.image(base)?;
            record.check_root()?;
            (Some(record), None)
        }
        Base::Debian { .. } => {
            let tools = DebianTools {
                debootstrap: require_tool("debootstrap", "apt-get install debootstrap")?,
                unshare: require_tool("unshare", "apt-get install util-linux")?,
            };
            (None, Some(tools))
        }
    };
    require_tool(MKFS, "apt-get install erofs-utils")?;
    let base_layers = base_image.as_ref().map_or(0, |b| b.layers.len());
    let most = base_layers + usize::from(base_image.is_none()) + recipe.steps.len();
    if most > brig_policy::MAX_LAYERS {
        return Err(ImageError::BadRecipe {
            path: recipe.path.clone(),
            reason: format!(
                "the image would have up to {most} layers, more than the {} allowed",
                brig_policy::MAX_LAYERS
            ),
        });
    }

    let host_ca = host_ca_bundle();
    let work = store.work_dir("build")?;
    let total = recipe.steps.len() + usize::from(base_image.is_none());
    let mut counter = StepCounter {
        done: 0,
        total,
        progress,
    };

    let (mut layers, base_config) = match (&recipe.base, &base_image, &tools) {
        (Base::Debian { suite, mirror }, _, Some(tools)) => {
            let label = counter.start(&recipe.base.describe())?;
            let started = Instant::now();
            let digest = bootstrap_debian(store, &work, tools, suite, mirror, &label, &counter)?;
            report_layer(store, &digest, started);
            (vec![digest], ImageConfig::default())
        }
        (_, Some(image), _) => (image.layers.clone(), image.config.clone()),
        _ => unreachable!("the base was resolved above"),
    };
    let mut in_use = lock_layers(store, &layers)?;

    for step in &recipe.steps {
        let label = counter.start(&step.describe())?;
        let started = Instant::now();
        let spec = step_spec(step, &in_use, &base_config, host_ca.as_deref())?;
        let outcome = brig_jail::run(
            &spec,
            &brig_jail::HostConfig::default(),
            brig_jail::Stdio::Capture,
        )
        .map_err(|e| ImageError::Tool {
            tool: label.clone(),
            detail: e.to_string(),
        })?;
        if progress.cancelled() {
            return Err(ImageError::Interrupted);
        }
        check_outcome(&outcome, &label)?;
        let writes = outcome.writes.as_ref().ok_or_else(|| ImageError::Tool {
            tool: label.clone(),
            detail: "the sandbox handed back no writes".into(),
        })?;
        let placeholders = brig_jail::placeholders(&spec).map_err(|e| ImageError::Tool {
            tool: label.clone(),
            detail: e.to_string(),
        })?;
        // ops::snapshot turns the writes into a layer and records an image; that
        // record is only a vehicle here and goes as soon as the layers it names are
        // locked.
        let current = ImageRecord {
            name: format!("brig-build-{}-{}", std::process::id(), counter.done),
            layers: layers.clone(),
            config: base_config.clone(),
            created_unix: now_unix(),
            origin: format!("build {}", recipe_path.display()),
            kind: Default::default(),
        };
        let snapshot = brig_image::ops::snapshot(
            store,
            &brig_image::ops::Snapshot {
                base: &current,
                name: &current.name,
                writes: writes.as_fd(),
                placeholders: &placeholders,
                force_owner: None,
                replace: true,
                // A step writes no more than its tmpfs holds; sparse files count
                // whole, as packing reads them.
                max_bytes: Some(spec.limits.disk_bytes),
                charge_to: &[],
            },
            &counter,
        )?;
        let locked = lock_layers(store, &snapshot.layers);
        store.remove_image(&snapshot.name)?;
        in_use = locked?;
        drop(outcome);
        if snapshot.layers.len() == layers.len() {
            log("  wrote nothing: no layer");
            continue;
        }
        layers = snapshot.layers;
        report_layer(store, layers.last().expect("a layer was added"), started);
    }

    let config = brig_image::ops::merge_config(&base_config, &recipe.config);
    check_user(&config, &in_use, &recipe)?;
    let record = ImageRecord {
        name: name.to_string(),
        layers,
        config,
        created_unix: now_unix(),
        origin: format!("build {}", recipe_path.display()),
        kind: Default::default(),
    };
    let _lock = store.shared()?;
    store.commit_image(&record, replace, work.path())?;
    Ok(record)
}

/// Numbers the steps, for errors and the log; as the progress of the work, it
/// names its phases after the current step. A cancelled build stops between steps.
struct StepCounter<'a> {
    done: usize,
    total: usize,
    progress: &'a dyn Progress,
}

impl StepCounter<'_> {
    /// Announces the next step and returns its label for errors.
    fn start(&mut self, what: &str) -> Result<String, ImageError> {
        if self.progress.cancelled() {
            return Err(ImageError::Interrupted);
        }
        self.done += 1;
        let (done, total) = (self.done, self.total);
        log(&format!("step {done}/{total}: {what}"));
        self.progress.phase(&format!("step {done}/{total}"), None);
        Ok(format!("step {done}/{total} ({what})"))
    }
}

impl Progress for StepCounter<'_> {
    fn phase(&self, name: &str, total_bytes: Option<u64>) {
        let step = format!("step {}/{} {name}", self.done, self.total);
        self.progress.phase(&step, total_bytes);
    }

    fn advance(&self, bytes: u64) {
        self.progress.advance(bytes);
    }

    fn cancelled(&self) -> bool {
        self.progress.cancelled()
    }
}

/// A line of the build log on stderr. On a terminal the progress bar shows the
/// steps instead: lines written under it would tear it.
fn log(line: &str) {
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        eprintln!("{line}");
    }
}

/// The sandbox a step runs in: root with real ownership on the image so far, the
/// host's network, and limits sized for package installs rather than for
/// untrusted code.
fn step_spec(
    step: &Step,
    layers: &LayersInUse,
    base: &ImageConfig,
    host_ca: Option<&Path>,
) -> Result<SandboxSpec, ImageError> {
    let mut spec = SandboxSpec::new(step.command());
    spec.identity.mapping = IdMapping::Build;
    // A step runs as root in `/` whatever the base image says: a recipe is the
    // image's maker, not its user.
    let chosen = brig_image::Chosen {
        user: Some((0, 0)),
        cwd: Some("/".into()),
    };
    // HOME is root's, over the base image's; the steps' own env goes over both.
    spec.env.insert("HOME".into(), "/root".into());
    spec.env.extend(step.env());
    base.apply(&mut spec, &layers.mounts, &chosen)
        .map_err(ImageError::BadSource)?;
    spec.filesystem.capture_writes = true;
    spec.filesystem.binds = step.binds();
    spec.network = NetworkMode::Host;
    spec.limits = Limits {
        timeout_ms: Some(STEP_TIMEOUT.as_millis() as u64),
        memory_bytes: Some(STEP_MEMORY_BYTES),
        pids: Some(STEP_PIDS),
        cpus_millis: None,
        disk_bytes: STEP_DISK_BYTES,
        output_limit_bytes: STEP_OUTPUT_BYTES,
        nofile: STEP_NOFILE,
        ..Limits::default()
    };
    if let Some(bundle) = host_ca {
        spec.filesystem.binds.push(BindMount {
            source: bundle.to_path_buf(),
            target: HOST_CA_TARGET.into(),
            writable: false,
            idmapped: false,
            no_symlinks: false,
        });
        for variable in CA_VARIABLES {
            spec.env.insert(variable.into(), HOST_CA_TARGET.into());
        }
    }
    Ok(spec)
}

/// The host's CA bundle, which build steps trust as the host's own downloads do
/// (debootstrap's included): where TLS is intercepted by a proxy, its CA is there,
/// and an image may not have any bundle before its apt step installs one.
fn host_ca_bundle() -> Option<PathBuf> {
    let configured = std::env::var_os("SSL_CERT_FILE").map(PathBuf::from);
    configured
        .into_iter()
        .chain([PathBuf::from("/etc/ssl/certs/ca-certificates.crt")])
        .find(|path| path.is_absolute() && path.is_file())
        .and_then(|path| path.canonicalize().ok())
}

fn check_outcome(outcome: &brig_jail::Outcome, label: &str) -> Result<(), ImageError> {
    let detail = if let Some(error) = &outcome.error {
        format!("could not start: {error}")
    } else if outcome.timed_out {
        format!("timed out after {} min", STEP_TIMEOUT.as_secs() / 60)
    } else if outcome.oom_killed {
        format!("ran out of memory ({})", human_bytes(STEP_MEMORY_BYTES))
    } else if let Some(signal) = outcome.signal {
        format!("killed by signal {signal}")
    } else if outcome.exit_code == Some(0) {
        return Ok(());
    } else {
        let code = outcome
            .exit_code
            .map_or_else(|| "unknown".to_string(), |c| c.to_string());
        let tail = tail(&outcome.stderr).or_else(|| tail(&outcome.stdout));
        match tail {
            Some(tail) => format!("exit status {code}: {tail}"),
            None => format!("exit status {code}"),
        }
    };
    Err(ImageError::Tool {
        tool: label.into(),
        detail,
    })
}

/// The last few non-empty lines of `text` on one line.
fn tail(text: &str) -> Option<String> {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if lines.is_empty() {
        return None;
    }
    Some(lines[lines.len().saturating_sub(TAIL_LINES)..].join(" | "))
}

/// debootstrap into the work directory, then commits the tree as the first layer.
///
/// debootstrap runs on the host as root (Debian's own tool, installing packages it
/// verifies against Debian's keyring), in private mount and pid namespaces: the
/// /proc and /sys it mounts into the target vanish with it even if brig dies, and
/// killing it kills everything it started.
fn bootstrap_debian(
    store: &Store,
    work: &WorkDir,
    tools: &DebianTools,
    suite: &str,
    mirror: &str,
    label: &str,
    progress: &dyn Progress,
) -> Result<String, ImageError> {
    let rootfs = work.path().join("rootfs");
    let log_path = work.path().join("debootstrap.log");
    let log = File::create(&log_path).context(|| format!("create {}", log_path.display()))?;
    let stderr = log
        .try_clone()
        .context(|| format!("open {}", log_path.display()))?;
    let argv = debootstrap_command(suite, mirror, &rootfs);
    let mut child = Command::new(&tools.unshare)
        .args([
            "--mount",
            "--propagation",
            "private",
            "--pid",
            "--fork",
            "--kill-child",
        ])
        .arg(&tools.debootstrap)
        .args(&argv[1..])
        .env("PATH", brig_policy::defaults::PATH)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(stderr)
        .spawn()
        .map_err(|e| ImageError::Tool {
            tool: label.into(),
            detail: format!("cannot start unshare: {e}"),
        })?;
    // Killing unshare (--kill-child) kills debootstrap's whole pid namespace.
    let status = brig_image::pack::wait_cancellable(&mut child, "debootstrap", progress)?;
    if !status.success() {
        let output = std::fs::read_to_string(&log_path).unwrap_or_default();
        // debootstrap's own log holds the failing command's output.
        let inner = std::fs::read_to_string(rootfs.join("debootstrap/debootstrap.log"))
            .ok()
            .and_then(|text| tail(&text));
        let mut detail = format!("{status}");
        for part in [tail(&output), inner].into_iter().flatten() {
            detail.push_str(": ");
            detail.push_str(&part);
        }
        return Err(ImageError::Tool {
            tool: label.into(),
            detail,
        });
    }
    trim_rootfs(&rootfs)?;
    if let Some(sources) = debian_sources(suite, mirror) {
        let path = rootfs.join("etc/apt/sources.list");
        std::fs::write(&path, sources).context(|| format!("write {}", path.display()))?;
    }
    let _lock = store.shared()?;
    let record = store.commit_layer(&rootfs, &PackOptions::default(), work.path(), progress)?;
    // Free the disk now rather than when the whole build ends.
    let _ = brig_image::store::remove_tree(&rootfs);
    Ok(record.digest)
}

/// Drops what a fresh debootstrap holds that has no place in an image: downloaded
/// packages and package lists (apt steps fetch fresh ones), device nodes (every
/// sandbox gets its own /dev), and the build host's name and resolver settings,
/// which debootstrap copies in (brig writes a sandbox's own over them).
fn trim_rootfs(rootfs: &Path) -> Result<(), ImageError> {
    remove_entries(&rootfs.join("var/cache/apt/archives"), |name| {
        name.as_encoded_bytes().ends_with(b".deb")
    })?;
    remove_entries(&rootfs.join("var/lib/apt/lists"), |_| true)?;
    remove_entries(&rootfs.join("dev"), |_| true)?;
    for file in ["etc/hostname", "etc/resolv.conf"] {
        let path = rootfs.join(file);
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
            std::fs::write(&path, "").context(|| format!("clear {}", path.display()))?;
        }
    }
    Ok(())
}

/// Removes the entries of `dir` whose names `doomed` picks; a missing `dir` has none.
fn remove_entries(dir: &Path, doomed: impl Fn(&OsStr) -> bool) -> Result<(), ImageError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries {
        let entry = entry.context(|| format!("list {}", dir.display()))?;
        if doomed(&entry.file_name()) {
            brig_image::store::remove_tree(&entry.path())
                .context(|| format!("remove {}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// Mounts and locks `layers` (bottom first) against gc for as long as the result lives.
fn lock_layers(store: &Store, layers: &[String]) -> Result<LayersInUse, ImageError> {
    store.use_layers(&ImageRecord {
        name: "build".into(),
        layers: layers.to_vec(),
        config: ImageConfig::default(),
        created_unix: 0,
        origin: String::new(),
        kind: Default::default(),
    })
}

fn report_layer(store: &Store, digest: &str, started: Instant) {
    let size = store.layer(digest).map(|l| l.file_bytes).unwrap_or(0);
    let short = digest.get(..19).unwrap_or(digest);
    log(&format!(
        "  layer {short} ({}) in {:.1}s",
        human_bytes(size),
        started.elapsed().as_secs_f64()
    ));
}

/// A user given by name must exist in the finished image, or no sandbox could
/// start from it.
fn check_user(
    config: &ImageConfig,
    layers: &LayersInUse,
    recipe: &Recipe,
) -> Result<(), ImageError> {
    let Some(user) = &config.user else {
        return Ok(());
    };
    brig_image::resolve_user(user, &layers.mounts).map_err(|e| ImageError::BadRecipe {
        path: recipe.path.clone(),
        reason: format!("config.user names a {e} of the built image"),
    })?;
    Ok(())
}

/// The host tools a Debian base needs, found before any work starts.
struct DebianTools {
    debootstrap: PathBuf,
    unshare: PathBuf,
}

/// Where `tool` is installed; fails early, saying how to install it, if it is not.
fn require_tool(tool: &str, install: &str) -> Result<PathBuf, ImageError> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    // root's PATH may lack the sbin directories debootstrap lives in.
    let dirs = std::env::split_paths(&path).chain(["/usr/sbin", "/sbin"].map(PathBuf::from));
    for dir in dirs {
        let path = dir.join(tool);
        if path.is_file() {
            return Ok(path);
        }
    }
    Err(ImageError::Tool {
        tool: tool.into(),
        detail: format!("not found: install it with `{install}`"),
    })
}
