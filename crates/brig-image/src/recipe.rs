//! Image recipes: the TOML files `brig image build` makes images from.
//!
//! ```toml
//! [base]
//! debian = "bookworm"        # debootstrap --variant=minbase; or image = "NAME"
//! mirror = "http://deb.debian.org/debian"     # optional, debian only
//! apt = ["python3"]          # one step: apt-get install --no-install-recommends
//! pip = ["numpy"]            # one step: python3 -m pip install
//! run = ["useradd ..."]      # one step each, `sh -c`
//!
//! [[copy]]                   # all copies together are one step
//! src = "files/app"          # relative to the recipe's directory, inside it
//! dst = "/opt/app"           # absolute: the path src becomes in the image
//!
//! [config]
//! env = { MPLBACKEND = "Agg" }
//! user = "1000"
//! workdir = "/workspace"
//! entrypoint = []
//! cmd = ["python3"]
//! ```
//!
//! Steps run in this order: the base, apt, pip, the copies, each `run` command,
//! and last the creation of `config.workdir` if the image lacks it. Each step that
//! writes something becomes one layer. Every field is checked when the recipe is
//! loaded, before anything is built, so a bad recipe changes nothing.
//!
//! - A Debian base gets its suite's `-updates` and `-security` sources too when it
//!   comes from the default mirror (see [`debian_sources`]).
//! - Steps run as root in `/` with `HOME=/root`, the base image's environment (not
//!   `[config]`'s, which is for the finished image) and the host's network; they
//!   trust the host's CA bundle. Writes under `/tmp` are scratch, not kept.
//! - A copy's source is bound by the canonical path checked at load, resolved
//!   without following symlinks: one swapped in since fails the step.
//! - Copies keep modes and mtimes and belong to root, as with a Dockerfile's COPY;
//!   a directory is merged into one the image has. They run `sh`, `mkdir`,
//!   `dirname` and GNU `cp` of the image, so it needs coreutils.
//! - Package names never pass through a shell: they are arguments of apt-get and
//!   pip (the apt step's fixed script reads them as `"$@"`). apt names may carry
//!   `:arch`, `=version` or `/release`; pip names extras and version specifiers,
//!   not URLs or environment markers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{ImageError, Result};
use crate::ImageConfig;

/// Where debootstrap downloads Debian from unless the recipe says otherwise.
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

/// Where the copy step binds each source inside the build sandbox. Under /tmp,
/// the sandbox's scratch tmpfs, so neither the mount points nor the sources end up
/// in the layer.
const COPY_STAGE: &str = "/tmp/brig-copy";

/// Copies each (source, destination) pair given as arguments; the sources are the
/// bound host paths. `cp -T` makes `dst` the copy of `src` itself (a directory is
/// merged into an existing one), and not preserving ownership makes the copies
/// root's, as a Dockerfile's COPY does.
const COPY_SCRIPT: &str = r#"set -e
while [ "$#" -gt 0 ]; do
  mkdir -p -- "$(dirname -- "$2")"
  cp -R -T --preserve=mode,timestamps -- "$1" "$2"
  shift 2
done"#;

/// Installs the packages given as arguments and leaves no package lists or
/// downloaded .debs in the layer.
const APT_SCRIPT: &str = "set -e
apt-get update
apt-get install -y --no-install-recommends \"$@\"
apt-get clean
rm -rf /var/lib/apt/lists/*";

/// Paths where a copy would land outside the layer: brig mounts its own
/// filesystems there in every sandbox.
const MANAGED_DIRS: &[&str] = &["/tmp", "/proc", "/dev", "/sys"];

// ----- The file as written -------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecipeFile {
    base: BaseFile,
    #[serde(default)]
    copy: Vec<CopyFile>,
    #[serde(default)]
    config: ConfigFile,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BaseFile {
    debian: Option<String>,
    mirror: Option<String>,
    image: Option<String>,
    #[serde(default)]
    apt: Vec<String>,
    #[serde(default)]
    pip: Vec<String>,
    #[serde(default)]
    run: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CopyFile {
    src: String,
    dst: String,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    env: BTreeMap<String, String>,
    user: Option<String>,
    workdir: Option<String>,
    #[serde(default)]
    entrypoint: Vec<String>,
    #[serde(default)]
    cmd: Vec<String>,
}

// ----- The checked recipe ----------------------------------------------------------

/// A recipe that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipe {
    /// The recipe file, as given.
    pub path: PathBuf,
    pub base: Base,
    /// What runs on top of the base, in order.
    pub steps: Vec<Step>,
    /// The recipe's own config; it overrides the base image's.
    pub config: ImageConfig,
}

/// What the image starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    /// A fresh Debian made by debootstrap on the host.
    Debian { suite: String, mirror: String },
    /// An image already in the store.
    Image(String),
}

/// One build step: a command run as root in a sandbox on the image so far, whose
/// writes become one layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Apt(Vec<String>),
    Pip(Vec<String>),
    Copy(Vec<CopyItem>),
    Run(String),
    /// Creates the config's working directory (nothing is written if it exists).
    Workdir(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyItem {
    /// The source's canonical host path (inside the recipe's directory).
    pub src: PathBuf,
    /// Normalized absolute path in the image.
    pub dst: String,
}

impl Recipe {
    /// Reads and checks the recipe at `path`. Relative `src` paths are resolved
    /// against the recipe's directory and must exist.
    pub fn load(path: &Path) -> Result<Recipe> {
        let bad = |reason: String| ImageError::BadRecipe {
            path: path.to_path_buf(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read: {e}")))?;
        let dir = path
            .parent()
            .map(|p| {
                if p.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    p
                }
            })
            .unwrap_or(Path::new("."));
        Recipe::parse(&text, path, dir)
    }

    /// Checks recipe `text`; `path` names it in errors and `dir` is where `src`
    /// paths are resolved.
    pub fn parse(text: &str, path: &Path, dir: &Path) -> Result<Recipe> {
        let bad = |reason: String| ImageError::BadRecipe {
            path: path.to_path_buf(),
            reason,
        };
        let file: RecipeFile = toml::from_str(text).map_err(|e| bad(toml_error(text, &e)))?;

        let base = match (file.base.debian, file.base.image) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "base.debian and base.image exclude each other: set one".into(),
                ))
            }
            (None, None) => {
                return Err(bad(
                    "base needs debian = \"SUITE\" (e.g. \"bookworm\") or image = \"NAME\"".into(),
                ))
            }
            (Some(suite), None) => {
                check_suite(&suite).map_err(&bad)?;
                let mirror = file
                    .base
                    .mirror
                    .unwrap_or_else(|| DEFAULT_MIRROR.to_string());
                check_mirror(&mirror).map_err(&bad)?;
                Base::Debian { suite, mirror }
            }
            (None, Some(image)) => {
                if file.base.mirror.is_some() {
                    return Err(bad("base.mirror applies to base.debian only".into()));
                }
                crate::store::validate_name(&image).map_err(|e| bad(format!("base.image: {e}")))?;
                Base::Image(image)
            }
        };

        let mut steps = Vec::new();
        if !file.base.apt.is_empty() {
            for name in &file.base.apt {
                check_package(name, is_apt_char).map_err(|r| bad(format!("base.apt: {r}")))?;
            }
            steps.push(Step::Apt(file.base.apt));
        }
        if !file.base.pip.is_empty() {
            for name in &file.base.pip {
                check_package(name, is_pip_char).map_err(|r| bad(format!("base.pip: {r}")))?;
            }
            steps.push(Step::Pip(file.base.pip));
        }
        if !file.copy.is_empty() {
            let root = dir.canonicalize().map_err(|e| {
                bad(format!(
                    "cannot resolve the recipe's directory {}: {e}",
                    dir.display()
                ))
            })?;
            let items = file
                .copy
                .iter()
                .enumerate()
                .map(|(i, copy)| copy_item(copy, &root).map_err(|r| bad(format!("copy[{i}]: {r}"))))
                .collect::<Result<Vec<_>>>()?;
            steps.push(Step::Copy(items));
        }
        for (i, command) in file.base.run.into_iter().enumerate() {
            if command.trim().is_empty() || command.contains('\0') {
                return Err(bad(format!(
                    "base.run[{i}] must be a non-empty shell command without NUL bytes"
                )));
            }
            steps.push(Step::Run(command));
        }

        let config = config(file.config).map_err(&bad)?;
        if let Some(workdir) = &config.workdir {
            steps.push(Step::Workdir(workdir.clone()));
        }
        Ok(Recipe {
            path: path.to_path_buf(),
            base,
            steps,
            config,
        })
    }
}

/// A TOML error on one line: where it is and what is wrong (toml's own rendering
/// quotes the source over several lines).
fn toml_error(text: &str, error: &toml::de::Error) -> String {
    let message = error.message().trim().replace('\n', " ");
    match error.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            format!("line {line}: {message}")
        }
        None => message,
    }
}

fn check_suite(suite: &str) -> std::result::Result<(), String> {
    let ok = !suite.is_empty()
        && suite.len() <= 64
        && suite
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "base.debian '{suite}' is not a Debian suite name (such as bookworm or stable)"
        ))
    }
}

fn check_mirror(mirror: &str) -> std::result::Result<(), String> {
    let ok = (mirror.starts_with("http://") || mirror.starts_with("https://"))
        && mirror.len() > "https://".len()
        && !mirror.chars().any(|c| c.is_whitespace() || c.is_control());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "base.mirror '{mirror}' is not an http:// or https:// URL"
        ))
    }
}

/// Debian package names (`name[:arch][=version|/release]`).
fn is_apt_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-' | '_' | ':' | '=' | '~' | '/')
}

/// PEP 508 names with extras and version specifiers (`pandas[excel]>=2,<3`); no
/// URLs and no environment markers. `<` and `>` are fine: nothing goes through a
/// shell.
fn is_pip_char(c: char) -> bool {
    c.is_ascii_alphanumeric()
        || matches!(
            c,
            '.' | '-' | '_' | '[' | ']' | ',' | '=' | '<' | '>' | '!' | '~' | '*' | '+'
        )
}

fn check_package(name: &str, allowed: fn(char) -> bool) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err("empty package name".into());
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(format!(
            "package '{name}' must start with a letter or digit"
        ));
    }
    if let Some(c) = name.chars().find(|&c| !allowed(c)) {
        return Err(format!(
            "package '{name}' contains '{}'",
            c.escape_default()
        ));
    }
    Ok(())
}

fn copy_item(copy: &CopyFile, root: &Path) -> std::result::Result<CopyItem, String> {
    let src = Path::new(&copy.src);
    if copy.src.is_empty() || src.is_absolute() {
        return Err(format!(
            "src '{}' must be a path relative to the recipe's directory",
            copy.src
        ));
    }
    // Canonical, so a `..` or a symlink that leads out of the directory is caught.
    let resolved = root.join(src).canonicalize().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("src '{}' does not exist", copy.src),
        _ => format!("src '{}': {e}", copy.src),
    })?;
    if !resolved.starts_with(root) {
        return Err(format!(
            "src '{}' is outside the recipe's directory {}",
            copy.src,
            root.display()
        ));
    }
    let dst = absolute_path(&copy.dst).map_err(|()| {
        format!(
            "dst '{}' must be an absolute path in the image without '..'",
            copy.dst
        )
    })?;
    if dst == "/" {
        return Err("dst '/' is not allowed: name the file or directory src becomes".into());
    }
    if let Some(dir) = MANAGED_DIRS
        .iter()
        .find(|d| dst == **d || dst.starts_with(&format!("{d}/")))
    {
        return Err(format!(
            "dst '{}' is below {dir}, which brig mounts afresh in every sandbox",
            copy.dst
        ));
    }
    Ok(CopyItem { src: resolved, dst })
}

fn absolute_path(path: &str) -> std::result::Result<String, ()> {
    brig_policy::normalize_sandbox_path(path).map_err(|_| ())
}

fn config(file: ConfigFile) -> std::result::Result<ImageConfig, String> {
    let mut env = Vec::with_capacity(file.env.len());
    for (key, value) in file.env {
        let key_ok = !key.is_empty()
            && !key.starts_with(|c: char| c.is_ascii_digit())
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !key_ok {
            return Err(format!(
                "config.env key '{key}' must be letters, digits and '_', not starting with a digit"
            ));
        }
        if value.contains('\0') {
            return Err(format!("config.env {key} contains a NUL byte"));
        }
        env.push(format!("{key}={value}"));
    }
    if let Some(user) = &file.user {
        check_user(user)?;
    }
    let workdir = file
        .workdir
        .map(|dir| {
            absolute_path(&dir).map_err(|()| {
                format!("config.workdir '{dir}' must be an absolute path without '..'")
            })
        })
        .transpose()?;
    for (field, argv) in [("entrypoint", &file.entrypoint), ("cmd", &file.cmd)] {
        if argv.iter().any(|arg| arg.contains('\0')) {
            return Err(format!("config.{field} contains a NUL byte"));
        }
        if argv.first().is_some_and(|a| a.is_empty()) {
            return Err(format!("config.{field} starts with an empty program name"));
        }
    }
    Ok(ImageConfig {
        env,
        user: file.user,
        workdir,
        entrypoint: file.entrypoint,
        cmd: file.cmd,
    })
}

/// `UID`, `UID:GID`, `NAME` or `NAME:GROUP`; names are looked up in the image's
/// own /etc/passwd and /etc/group when a sandbox starts.
fn check_user(user: &str) -> std::result::Result<(), String> {
    let part_ok = |part: &str| {
        !part.is_empty()
            && !part.starts_with('-')
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    };
    let ok = match user.split_once(':') {
        Some((u, g)) => part_ok(u) && part_ok(g),
        None => part_ok(user),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "config.user '{user}' must be UID, UID:GID, NAME or NAME:GROUP"
        ))
    }
}

// ----- What each step runs ---------------------------------------------------------

impl Step {
    /// A short description for progress and errors.
    pub fn describe(&self) -> String {
        fn list(verb: &str, items: &[String]) -> String {
            const SHOWN: usize = 4;
            let mut text = format!("{verb} {}", items[..items.len().min(SHOWN)].join(" "));
            if items.len() > SHOWN {
                text.push_str(&format!(" (+{} more)", items.len() - SHOWN));
            }
            text
        }
        match self {
            Step::Apt(packages) => list("apt-get install", packages),
            Step::Pip(packages) => list("pip install", packages),
            Step::Copy(items) => {
                let dsts: Vec<String> = items.iter().map(|i| i.dst.clone()).collect();
                list("copy to", &dsts)
            }
            Step::Run(command) => {
                const SHOWN: usize = 60;
                let line = command.trim().lines().next().unwrap_or_default();
                let mut short: String = line.chars().take(SHOWN).collect();
                if line.chars().count() > SHOWN || line.len() < command.trim().len() {
                    short.push('…');
                }
                format!("run {short}")
            }
            Step::Workdir(dir) => format!("workdir {dir}"),
        }
    }

    /// The command's argv inside the build sandbox.
    pub fn command(&self) -> Vec<String> {
        let sh = |script: &str, name: &str, args: &mut dyn Iterator<Item = String>| {
            let mut argv = vec!["/bin/sh".into(), "-c".into(), script.into(), name.into()];
            argv.extend(args);
            argv
        };
        match self {
            Step::Apt(packages) => sh(APT_SCRIPT, "brig-apt", &mut packages.iter().cloned()),
            Step::Pip(packages) => {
                let mut argv: Vec<String> = ["python3", "-m", "pip", "install", "--no-cache-dir"]
                    .map(String::from)
                    .into();
                argv.extend(packages.iter().cloned());
                argv
            }
            Step::Copy(_) => {
                let mut pairs = self
                    .binds()
                    .into_iter()
                    .zip(self.copy_items())
                    .flat_map(|(bind, item)| [bind.target, item.dst.clone()]);
                sh(COPY_SCRIPT, "brig-copy", &mut pairs)
            }
            Step::Run(command) => vec!["/bin/sh".into(), "-c".into(), command.clone()],
            Step::Workdir(dir) => vec!["mkdir".into(), "-p".into(), "--".into(), dir.clone()],
        }
    }

    /// Environment the step needs on top of the base image's.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![("DEBIAN_FRONTEND", "noninteractive")];
        if let Step::Pip(_) = self {
            // Options as variables, which older pips ignore instead of refusing.
            // PEP 668 (Debian 12) refuses system-wide installs without the first.
            env.extend([
                ("PIP_BREAK_SYSTEM_PACKAGES", "1"),
                ("PIP_ROOT_USER_ACTION", "ignore"),
                ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
            ]);
        }
        env.into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Host paths the step needs inside the sandbox, read-only.
    pub fn binds(&self) -> Vec<brig_policy::BindMount> {
        self.copy_items()
            .iter()
            .enumerate()
            .map(|(i, item)| brig_policy::BindMount {
                source: item.src.clone(),
                target: format!("{COPY_STAGE}/{i}"),
                writable: false,
                idmapped: false,
                no_symlinks: true,
            })
            .collect()
    }

    fn copy_items(&self) -> &[CopyItem] {
        match self {
            Step::Copy(items) => items,
            _ => &[],
        }
    }
}

impl Base {
    pub fn describe(&self) -> String {
        match self {
            Base::Debian { suite, .. } => format!("debootstrap {suite}"),
            Base::Image(name) => format!("image {name}"),
        }
    }
}

/// debootstrap's argv for a minimal Debian in `target`.
pub fn debootstrap_command(suite: &str, mirror: &str, target: &Path) -> Vec<String> {
    vec![
        "debootstrap".into(),
        "--variant=minbase".into(),
        suite.into(),
        target.to_string_lossy().into_owned(),
        mirror.into(),
    ]
}

/// The apt sources of a fresh Debian from the default mirror: the suite with its
/// stable updates and security updates (debootstrap writes only the suite). `None`
/// for suites without them (unstable) and for other mirrors, whose matching
/// security mirror brig cannot know: debootstrap's own line stays.
pub fn debian_sources(suite: &str, mirror: &str) -> Option<String> {
    if mirror != DEFAULT_MIRROR || matches!(suite, "sid" | "unstable" | "experimental") {
        return None;
    }
    Some(format!(
        "deb {mirror} {suite} main\n\
         deb {mirror} {suite}-updates main\n\
         deb http://deb.debian.org/debian-security {suite}-security main\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in(dir: &Path, text: &str) -> Result<Recipe> {
        Recipe::parse(text, Path::new("r.toml"), dir)
    }

    fn parse(text: &str) -> Result<Recipe> {
        parse_in(Path::new("."), text)
    }

    fn reason(result: Result<Recipe>) -> String {
        match result {
            Err(ImageError::BadRecipe { reason, .. }) => reason,
            other => panic!("expected a recipe error, got {other:?}"),
        }
    }

    #[test]
    fn full_recipe_parses_into_ordered_steps() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("app")).unwrap();
        std::fs::write(dir.path().join("app/main.py"), "print(1)").unwrap();
        let recipe = parse_in(
            dir.path(),
            r#"
            [base]
            debian = "bookworm"
            apt = ["python3", "libfoo1:amd64=1.2-3"]
            pip = ["numpy", "pandas[excel]>=2,<3"]
            run = ["useradd -m user", "true"]
            [[copy]]
            src = "app"
            dst = "/opt//app/"
            [config]
            env = { MPLBACKEND = "Agg", A = "x=y" }
            user = "user"
            workdir = "/workspace"
            cmd = ["python3"]
            "#,
        )
        .unwrap();
        assert_eq!(
            recipe.base,
            Base::Debian {
                suite: "bookworm".into(),
                mirror: DEFAULT_MIRROR.into()
            }
        );
        let kinds: Vec<String> = recipe.steps.iter().map(Step::describe).collect();
        assert_eq!(
            kinds,
            [
                "apt-get install python3 libfoo1:amd64=1.2-3",
                "pip install numpy pandas[excel]>=2,<3",
                "copy to /opt/app",
                "run useradd -m user",
                "run true",
                "workdir /workspace",
            ]
        );
        let Step::Copy(items) = &recipe.steps[2] else {
            panic!()
        };
        assert_eq!(items[0].src, dir.path().canonicalize().unwrap().join("app"));
        assert_eq!(recipe.config.env, ["A=x=y", "MPLBACKEND=Agg"]);
        assert_eq!(recipe.config.user.as_deref(), Some("user"));
        assert_eq!(recipe.config.cmd, ["python3"]);
    }

    #[test]
    fn unknown_keys_are_named() {
        for (text, key) in [
            ("[base]\ndebian = \"bookworm\"\napt_get = []", "apt_get"),
            (
                "[base]\ndebian = \"bookworm\"\n[config]\nworkdri = \"/\"",
                "workdri",
            ),
            (
                "[base]\ndebian = \"bookworm\"\n[[copy]]\nsrc = \"a\"\ndst = \"/a\"\nmode = 1",
                "mode",
            ),
            ("bogus = 1\n[base]\ndebian = \"bookworm\"", "bogus"),
        ] {
            let reason = reason(parse(text));
            assert!(reason.contains(key), "{reason}");
            assert!(reason.starts_with("line "), "{reason}");
            assert!(!reason.contains('\n'), "{reason}");
        }
    }

    #[test]
    fn base_must_be_exactly_one_source() {
        assert!(reason(parse("[base]\napt = [\"x\"]")).contains("debian"));
        assert!(reason(parse("[base]\ndebian = \"bookworm\"\nimage = \"x\"")).contains("exclude"));
        assert!(reason(parse("[base]\nimage = \"x\"\nmirror = \"http://m\"")).contains("mirror"));
        assert!(reason(parse("[base]\ndebian = \"book worm\"")).contains("suite"));
        assert!(
            reason(parse("[base]\ndebian = \"bookworm\"\nmirror = \"ftp://x\"")).contains("URL")
        );
        assert!(reason(parse("[base]\nimage = \"../x\"")).contains("base.image"));
        assert_eq!(
            parse("[base]\nimage = \"py:3\"").unwrap().base,
            Base::Image("py:3".into())
        );
        assert!(reason(parse("")).contains("base"));
    }

    #[test]
    fn package_names_with_shell_syntax_are_refused() {
        for bad in [
            "", " x", "-o", "a;b", "a b", "$(x)", "a`b`", "a|b", "a&b", "a\nb", "a'b",
        ] {
            let text = format!("[base]\ndebian = \"bookworm\"\napt = [{bad:?}]");
            assert!(reason(parse(&text)).starts_with("base.apt"), "{bad:?}");
            let text = format!("[base]\ndebian = \"bookworm\"\npip = [{bad:?}]");
            assert!(reason(parse(&text)).starts_with("base.pip"), "{bad:?}");
        }
        // Redirection characters are version specifiers for pip, not for apt.
        assert!(parse("[base]\ndebian = \"s\"\npip = [\"numpy<2\"]").is_ok());
        assert!(parse("[base]\ndebian = \"s\"\napt = [\"numpy<2\"]").is_err());
    }

    #[test]
    fn copies_stay_inside_the_recipe_directory() {
        let outer = tempfile::tempdir().unwrap();
        let dir = outer.path().join("recipe");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(outer.path().join("secret"), "x").unwrap();
        std::fs::write(dir.join("ok"), "x").unwrap();
        std::os::unix::fs::symlink("../secret", dir.join("link")).unwrap();
        let copy = |src: &str, dst: &str| {
            let text = format!("[base]\nimage = \"b\"\n[[copy]]\nsrc = {src:?}\ndst = {dst:?}");
            parse_in(&dir, &text)
        };
        assert!(copy("ok", "/etc/ok").is_ok());
        assert!(reason(copy("../secret", "/x")).contains("outside"));
        assert!(reason(copy("link", "/x")).contains("outside"));
        assert!(reason(copy("/etc/passwd", "/x")).contains("relative"));
        assert!(reason(copy("missing", "/x")).contains("'missing' does not exist"));
        assert!(reason(copy("ok", "etc/ok")).contains("absolute"));
        assert!(reason(copy("ok", "/etc/../x")).contains("absolute"));
        assert!(reason(copy("ok", "/")).contains("'/'"));
        assert!(reason(copy("ok", "/tmp/x")).contains("/tmp"));
        assert!(reason(copy("ok", "/proc")).contains("/proc"));
        assert!(copy("ok", "/tmpfiles/x").is_ok());
    }

    #[test]
    fn config_is_checked() {
        let with = |config: &str| parse(&format!("[base]\nimage = \"b\"\n[config]\n{config}"));
        assert!(reason(with("env = { \"A=B\" = \"1\" }")).contains("config.env"));
        assert!(reason(with("env = { \"\" = \"1\" }")).contains("config.env"));
        assert!(reason(with("user = \"a b\"")).contains("config.user"));
        assert!(reason(with("user = \"1000:\"")).contains("config.user"));
        assert!(reason(with("workdir = \"work\"")).contains("config.workdir"));
        assert!(reason(with("cmd = [\"\"]")).contains("config.cmd"));
        assert!(reason(with("env = { A = 1 }")).contains("line 4"));
        let recipe = with("user = \"1000:100\"\nworkdir = \"/srv//w/\"").unwrap();
        assert_eq!(recipe.config.workdir.as_deref(), Some("/srv/w"));
        assert_eq!(recipe.steps, [Step::Workdir("/srv/w".into())]);
    }

    #[test]
    fn debian_sources_add_updates_for_released_suites() {
        let sources = debian_sources("bookworm", DEFAULT_MIRROR).unwrap();
        assert_eq!(
            sources.lines().collect::<Vec<_>>(),
            [
                "deb http://deb.debian.org/debian bookworm main",
                "deb http://deb.debian.org/debian bookworm-updates main",
                "deb http://deb.debian.org/debian-security bookworm-security main",
            ]
        );
        assert_eq!(debian_sources("sid", DEFAULT_MIRROR), None);
        assert_eq!(
            debian_sources("bookworm", "http://mirror.local/debian"),
            None
        );
    }

    #[test]
    fn packages_and_paths_are_arguments_not_script() {
        let apt = Step::Apt(vec!["python3".into(), "tesseract-ocr".into()]);
        let argv = apt.command();
        assert_eq!(&argv[..2], ["/bin/sh", "-c"]);
        assert!(!argv[2].contains("python3"));
        assert_eq!(&argv[4..], ["python3", "tesseract-ocr"]);

        let pip = Step::Pip(vec!["numpy<2".into()]);
        assert_eq!(pip.command().last().unwrap(), "numpy<2");

        let copy = Step::Copy(vec![
            CopyItem {
                src: "/r/a b".into(),
                dst: "/opt/a b".into(),
            },
            CopyItem {
                src: "/r/c".into(),
                dst: "/etc/c".into(),
            },
        ]);
        let argv = copy.command();
        assert!(!argv[2].contains("opt"));
        assert_eq!(
            &argv[4..],
            ["/tmp/brig-copy/0", "/opt/a b", "/tmp/brig-copy/1", "/etc/c"]
        );
        let binds = copy.binds();
        assert_eq!(binds[0].source, PathBuf::from("/r/a b"));
        assert!(!binds[0].writable);
        // Bound as checked at load: a symlink swapped in since fails the step.
        assert!(binds[0].no_symlinks);
    }
}
