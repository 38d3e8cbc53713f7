//! The default image (`--default-image`, what `/v1/execute` runs in), built in the
//! background by a daemon that starts without it, so that a fresh `brig serve`
//! answers `/v1/execute` with 503 only until the image is ready, and says how far
//! the build has come (`GET /health`, the log, the 503's message).
//!
//! The recipe is `--default-image-recipe`, else for `python` the one compiled into
//! the binary (images/python.toml). The build is `brig image build` run as a child
//! process of the daemon's own binary: building runs each step in a sandbox
//! (`brig_jail::run`), which must be started from a single-threaded process, and
//! the daemon is not one. A failed build is reported and not retried (a restart
//! tries again): a broken recipe or an offline host would otherwise rebuild for
//! ever.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;
use tokio::io::AsyncBufReadExt;

use crate::state::AppState;

/// The recipe of the standard `python` image, compiled in.
pub const PYTHON_RECIPE: &str = include_str!("../../../images/python.toml");

/// Lines of a failed build's output kept for its error.
const ERROR_LINES: usize = 3;

/// Where the default image stands, as `GET /health` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ImageState {
    /// In the store (or `host`): `/v1/execute` serves.
    Ready,
    /// Not in the store, and not being built.
    Missing { message: String },
    /// Being built: the step under way (`step 3/7: pip install ...`).
    Building { step: String, elapsed_seconds: u64 },
    /// The build failed; the daemon does not try again until it restarts.
    Failed { error: String },
}

/// The build's progress, kept by the daemon's state.
#[derive(Debug, Default)]
pub struct DefaultImageBuild {
    inner: Mutex<Option<Progress>>,
}

#[derive(Debug, Clone)]
enum Progress {
    Building { step: String, since: Instant },
    Failed { error: String },
}

impl DefaultImageBuild {
    fn set(&self, progress: Option<Progress>) {
        *self.inner.lock().unwrap_or_else(|e| e.into_inner()) = progress;
    }

    fn get(&self) -> Option<Progress> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Why `/v1/execute` cannot run now, if a build is under way or failed.
    pub fn problem(&self, name: &str) -> Option<String> {
        match self.get()? {
            Progress::Building { step, since } => Some(format!(
                "the daemon's default image '{name}' is being built ({step}; started {} s \
                 ago); /v1/execute serves once it is ready (GET /health shows the progress)",
                since.elapsed().as_secs()
            )),
            Progress::Failed { error } => Some(format!(
                "building the daemon's default image '{name}' failed ({error}); see the \
                 daemon's log, then build it by hand (`brig image build {name} -f RECIPE`) \
                 or restart the daemon to try again"
            )),
        }
    }
}

/// The state of the default image now (reads the store: blocking).
pub fn state(state: &AppState) -> ImageState {
    let name = &state.args.default_image;
    match state.default_image_build.get() {
        Some(Progress::Building { step, since }) => {
            return ImageState::Building {
                step,
                elapsed_seconds: since.elapsed().as_secs(),
            }
        }
        Some(Progress::Failed { error }) => return ImageState::Failed { error },
        None => {}
    }
    match crate::execute::default_image_problem(&state.args.store, name) {
        Some(message) => ImageState::Missing { message },
        None => ImageState::Ready,
    }
}

/// The recipe to build the default image from, if the daemon has one.
fn recipe(state: &AppState) -> Option<(String, PathBuf)> {
    match &state.args.default_image_recipe {
        Some(path) => Some((String::new(), path.clone())),
        None if state.args.default_image == "python" => Some((
            PYTHON_RECIPE.to_string(),
            state.data_dir.join("default-image-python.toml"),
        )),
        None => None,
    }
}

/// Starts building the default image in the background if it is missing from the
/// store, the daemon may build it (`--no-build-default-image` not given) and has a
/// recipe for it.
pub async fn spawn_build(state: &AppState) {
    let name = state.args.default_image.clone();
    if !state.args.build_default_image || name == "host" {
        return;
    }
    let (store, image) = (state.args.store.clone(), name.clone());
    let missing = tokio::task::spawn_blocking(move || {
        matches!(
            brig_image::store::Store::at(&store).image(&image),
            Err(brig_image::ImageError::NoSuchImage(_))
        )
    })
    .await
    .unwrap_or(false);
    if !missing {
        // Present (or damaged, which a build from scratch would not mend).
        let (store, image) = (state.args.store.clone(), name.clone());
        let problem = tokio::task::spawn_blocking(move || {
            crate::execute::default_image_problem(&store, &image)
        })
        .await
        .ok()
        .flatten();
        if let Some(problem) = problem {
            tracing::warn!("/v1/execute will answer 503 until this is fixed: {problem}");
        }
        return;
    }
    let Some((text, path)) = recipe(state) else {
        return;
    };
    if !text.is_empty() {
        if let Err(e) = std::fs::write(&path, text) {
            let error = format!("cannot write the recipe to {}: {e}", path.display());
            tracing::error!(image = %name, "{error}");
            state
                .default_image_build
                .set(Some(Progress::Failed { error }));
            return;
        }
    }
    state.default_image_build.set(Some(Progress::Building {
        step: "starting".into(),
        since: Instant::now(),
    }));
    tracing::info!(
        image = %name,
        recipe = %path.display(),
        "the default image is not in the store: building it in the background \
         (/v1/execute answers 503 until it is ready; --no-build-default-image turns this off)"
    );
    let state = state.clone();
    tokio::spawn(async move {
        let started = Instant::now();
        match build(&state, &name, &path).await {
            Ok(()) => {
                state.default_image_build.set(None);
                tracing::info!(
                    image = %name,
                    seconds = started.elapsed().as_secs(),
                    "the default image is built: /v1/execute serves"
                );
            }
            Err(error) => {
                tracing::error!(image = %name, "building the default image failed: {error}");
                state
                    .default_image_build
                    .set(Some(Progress::Failed { error }));
            }
        }
    });
}

/// `brig image build NAME -f RECIPE --store STORE`, its output logged line by line
/// and its steps recorded as the progress.
async fn build(state: &AppState, name: &str, recipe: &Path) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find brig's binary: {e}"))?;
    let mut child = tokio::process::Command::new(exe)
        .args(["image", "build", name, "-f"])
        .arg(recipe)
        .arg("--store")
        .arg(&state.args.store)
        .env_remove("BRIG_STORE")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start `brig image build`: {e}"))?;
    let mut lines = match child.stderr.take() {
        Some(stderr) => tokio::io::BufReader::new(stderr).lines(),
        None => return Err("`brig image build` has no stderr".into()),
    };
    let since = Instant::now();
    let mut last: Vec<String> = Vec::new();
    while let Ok(Some(line)) = lines.next_line().await {
        let line = line.trim().to_string();
        if line.is_empty() {
            continue;
        }
        tracing::info!(image = %name, "build: {line}");
        if line.starts_with("step ") {
            state.default_image_build.set(Some(Progress::Building {
                step: line.clone(),
                since,
            }));
        }
        last.push(line);
        if last.len() > ERROR_LINES {
            last.remove(0);
        }
    }
    let status = child
        .wait()
        .await
        .map_err(|e| format!("waiting for `brig image build`: {e}"))?;
    if status.success() {
        return Ok(());
    }
    Err(format!("{status}: {}", last.join(" | ")))
}
