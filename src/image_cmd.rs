//! `brig image ...` and the image side of `brig run --image`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use brig_image::store::{ImageRecord, LayersInUse, Store};
use brig_image::{ImageError, Progress};
use brig_policy::SandboxSpec;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use crate::EXIT_BRIG_ERROR;

#[derive(Args, Clone)]
pub struct StoreArgs {
    /// Where images are stored.
    #[arg(long, global = true, value_name = "DIR", env = "BRIG_STORE", default_value = brig_image::store::DEFAULT_STORE, value_parser = brig_image::store::absolute_store_path)]
    pub store: PathBuf,
}

#[derive(Args)]
pub struct ImageArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Subcommand)]
enum ImageCommand {
    /// Import a directory, a tar archive (plain, gzip or zstd), an OCI image layout
    /// (directory or tar) or a `docker save` archive as image NAME.
    Import {
        name: String,
        source: PathBuf,
        /// Replace NAME if it exists.
        #[arg(long)]
        replace: bool,
    },
    /// Build image NAME from a recipe (see images/python.toml).
    Build {
        name: String,
        #[arg(short = 'f', long = "file", value_name = "RECIPE.toml")]
        recipe: PathBuf,
        #[arg(long)]
        replace: bool,
    },
    /// List images.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Show an image's layers and config as JSON.
    Inspect { name: String },
    /// Remove an image (its layers stay until `brig image gc`).
    Rm { name: String },
    /// List paths added, changed and deleted from image A to image B.
    Diff {
        a: String,
        b: String,
        #[arg(long)]
        json: bool,
    },
    /// Remove layers no image references; a layer a sandbox is using is kept.
    Gc {
        /// Also unmount layers no sandbox is using (they are mounted again on use).
        #[arg(long)]
        unmount: bool,
        #[arg(long)]
        json: bool,
    },
}

/// An image a sandbox is about to run from, with its layers locked and mounted.
pub struct ImageInUse {
    pub record: ImageRecord,
    pub layers: LayersInUse,
    store: Store,
}

pub fn open_store(args: &StoreArgs) -> Result<Store, ImageError> {
    Store::open(&args.store)
}

/// Resolves, locks and mounts image `name` for a run. Checks the snapshot target
/// before anything runs, so a bad name changes nothing.
pub fn use_image(
    store_args: &StoreArgs,
    name: &str,
    snapshot_to: Option<&str>,
    replace: bool,
) -> Result<ImageInUse, ImageError> {
    if let Some(target) = snapshot_to {
        brig_image::store::validate_name(target)?;
    }
    let store = open_store(store_args)?;
    if let Some(target) = snapshot_to {
        if !replace && store.has_image(target) {
            return Err(ImageError::ImageExists(target.to_string()));
        }
    }
    let record = store.image(name)?;
    record.check_root()?;
    let layers = store.use_layers(&record)?;
    Ok(ImageInUse {
        record,
        layers,
        store,
    })
}

/// Commits a finished run's writes as image `name`.
pub fn snapshot(
    _store_args: &StoreArgs,
    image: &ImageInUse,
    name: &str,
    writes: &Arc<std::os::fd::OwnedFd>,
    spec: &SandboxSpec,
    replace: bool,
) -> Result<ImageRecord, ImageError> {
    use std::os::fd::AsFd;
    // With one mapped id, every file the sandbox wrote belongs to it, and it stood
    // for the image's root (see brig-jail's idmap): store them as root's again.
    let force_owner = match spec.identity.mapping {
        brig_policy::IdMapping::Single => Some((0, 0)),
        brig_policy::IdMapping::Build => None,
    };
    let placeholders =
        brig_jail::placeholders(spec).map_err(|e| ImageError::Unsupported(e.to_string()))?;
    brig_image::ops::snapshot(
        &image.store,
        &brig_image::ops::Snapshot {
            base: &image.record,
            name,
            writes: writes.as_fd(),
            placeholders: &placeholders,
            force_owner,
            replace,
            // All the tmpfs can hold without holes: a sparse file counts whole,
            // which is what packing reads.
            max_bytes: Some(spec.limits.disk_bytes),
            // The sandbox has ended, and its cgroup with it: brig pays.
            charge_to: &[],
        },
        &Bars::new(false),
    )
}

/// Progress bars on stderr when it is a terminal; Ctrl-C cancels cleanly.
pub struct Bars {
    bar: Option<ProgressBar>,
    interrupted: Arc<AtomicBool>,
}

impl Bars {
    pub fn new(show: bool) -> Bars {
        let interrupted = Arc::new(AtomicBool::new(false));
        for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            let _ = signal_hook::flag::register(signal, Arc::clone(&interrupted));
        }
        let bar = (show && std::io::IsTerminal::is_terminal(&std::io::stderr())).then(|| {
            let bar = ProgressBar::new(0);
            bar.set_style(
                ProgressStyle::with_template(
                    "{msg:>18} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar
        });
        Bars { bar, interrupted }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Progress for Bars {
    fn phase(&self, name: &str, total_bytes: Option<u64>) {
        if let Some(bar) = &self.bar {
            bar.set_message(name.to_string());
            bar.set_position(0);
            bar.set_length(total_bytes.unwrap_or(0));
        }
    }

    fn advance(&self, bytes: u64) {
        if let Some(bar) = &self.bar {
            if bar.length() == Some(0) {
                bar.set_length(bar.position() + bytes);
            }
            bar.inc(bytes);
        }
    }

    fn cancelled(&self) -> bool {
        self.interrupted.load(Ordering::Relaxed)
    }
}

fn image_fail(e: &ImageError) -> ExitCode {
    eprintln!("brig: {e}");
    ExitCode::from(EXIT_BRIG_ERROR)
}

fn print_json(value: &impl serde::Serialize) {
    outln!(
        "{}",
        serde_json::to_string_pretty(value).expect("values serialize")
    );
}

pub fn main(args: ImageArgs) -> ExitCode {
    match image_main(args) {
        Ok(code) => code,
        Err(e) => image_fail(&e),
    }
}

fn image_main(args: ImageArgs) -> Result<ExitCode, ImageError> {
    let store = open_store(&args.store)?;
    match args.command {
        ImageCommand::Import {
            name,
            source,
            replace,
        } => {
            let bars = Bars::new(true);
            let result = brig_image::ops::import(&store, &name, &source, replace, &bars);
            bars.finish();
            let record = result?;
            eprintln!(
                "imported {name}: {} layers, {}",
                record.layers.len(),
                human_bytes(store.image_bytes(&record))
            );
        }
        ImageCommand::Build {
            name,
            recipe,
            replace,
        } => {
            let bars = Bars::new(true);
            let result = crate::build_cmd::build(&store, &name, &recipe, replace, &bars);
            bars.finish();
            let record = result?;
            eprintln!(
                "built {name}: {} layers, {}",
                record.layers.len(),
                human_bytes(store.image_bytes(&record))
            );
        }
        ImageCommand::Ls { json } => {
            let images = store.images()?;
            if json {
                print_json(&images);
            } else {
                outln!("{:<32} {:>6} {:>10}  ORIGIN", "NAME", "LAYERS", "SIZE");
                for image in &images {
                    outln!(
                        "{:<32} {:>6} {:>10}  {}",
                        image.name,
                        image.layers.len(),
                        human_bytes(store.image_bytes(image)),
                        image.origin
                    );
                }
            }
        }
        ImageCommand::Inspect { name } => {
            let image = store.image(&name)?;
            let layers: Vec<_> = image
                .layers
                .iter()
                .map(|d| store.layer(d))
                .collect::<Result<_, _>>()?;
            print_json(&serde_json::json!({
                "name": image.name,
                "created_unix": image.created_unix,
                "origin": image.origin,
                "config": image.config,
                "size_bytes": store.image_bytes(&image),
                "layers": layers,
            }));
        }
        ImageCommand::Rm { name } => {
            store.remove_image(&name)?;
            eprintln!("removed {name}; `brig image gc` frees its layers");
        }
        ImageCommand::Diff { a, b, json } => {
            let diff = brig_image::ops::diff(&store, &a, &b)?;
            if json {
                print_json(&serde_json::json!({
                    "added": diff.added,
                    "changed": diff.changed,
                    "deleted": diff.deleted,
                }));
            } else {
                let mut lines: Vec<(&Path, char)> = Vec::new();
                lines.extend(diff.added.iter().map(|p| (p.as_path(), 'A')));
                lines.extend(diff.changed.iter().map(|p| (p.as_path(), 'C')));
                lines.extend(diff.deleted.iter().map(|p| (p.as_path(), 'D')));
                lines.sort();
                for (path, kind) in lines {
                    outln!("{kind} {}", path.display());
                }
            }
        }
        ImageCommand::Gc { unmount, json } => {
            let report = store.gc(unmount)?;
            if json {
                print_json(&report);
            } else {
                eprintln!(
                    "removed {} layers ({}), unmounted {}, kept {} in use",
                    report.removed_layers.len(),
                    human_bytes(report.freed_bytes),
                    report.unmounted.len(),
                    report.in_use.len()
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
