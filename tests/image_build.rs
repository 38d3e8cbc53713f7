//! `brig image build`: recipe checks, a small offline build, and the standard
//! `python` image (images/python.toml) built from Debian and PyPI.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use serde_json::Value;

/// A store in a temporary directory. Dropping it unmounts its layers (gc
/// --unmount) before deleting it, so a failing test leaves no mounts either.
struct TempStore {
    dir: tempfile::TempDir,
}

impl TempStore {
    fn new() -> TempStore {
        TempStore {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `brig image --store STORE args...`
    fn image(&self, args: &[&str]) -> Output {
        brig()
            .arg("image")
            .arg("--store")
            .arg(self.path())
            .args(args)
            .output()
            .expect("start brig")
    }

    /// `brig run --image NAME --store STORE run_args... -- cmd...`
    fn run(&self, image: &str, run_args: &[&str], cmd: &[&str]) -> Output {
        brig()
            .args(["run", "--image", image, "--store"])
            .arg(self.path())
            .args(run_args)
            .arg("--")
            .args(cmd)
            .output()
            .expect("start brig")
    }

    fn build(&self, name: &str, recipe: &Path, extra: &[&str]) -> Output {
        let recipe = recipe.to_str().unwrap();
        let mut args = vec!["build", name, "-f", recipe];
        args.extend_from_slice(extra);
        self.image(&args)
    }

    fn inspect(&self, name: &str) -> Value {
        let out = self.image(&["inspect", name]);
        assert!(out.status.success(), "inspect {name}: {out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Everything that makes up the store's state: image records and layers.
    fn listing(&self) -> Vec<String> {
        let mut names = Vec::new();
        for dir in ["images", "layers"] {
            if let Ok(entries) = std::fs::read_dir(self.path().join(dir)) {
                for entry in entries {
                    names.push(format!(
                        "{dir}/{}",
                        entry.unwrap().file_name().to_string_lossy()
                    ));
                }
            }
        }
        names.sort();
        names
    }

    /// Where a layer of image `name` is mounted on the host (while it is).
    fn layer_mount(&self, image: &Value, index: usize) -> PathBuf {
        let digest = image["layers"][index]["digest"].as_str().unwrap();
        self.path()
            .join("mnt")
            .join(digest.strip_prefix("sha256:").unwrap())
    }

    fn mounts(&self) -> Vec<String> {
        let store = self.path().to_string_lossy().into_owned();
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|line| line.contains(&store))
            .map(String::from)
            .collect()
    }
}

impl Drop for TempStore {
    fn drop(&mut self) {
        let out = self.image(&["gc", "--unmount"]);
        if !std::thread::panicking() {
            assert!(out.status.success(), "gc --unmount: {out:?}");
            assert_eq!(self.mounts(), Vec::<String>::new(), "layers left mounted");
        }
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A minimal merged-/usr root that can run the shell scripts of build steps
/// (`sh`, and the coreutils the copy step uses) with their libraries, plus the
/// directories brig mounts over, so a step that writes nothing leaves no trace.
fn shell_root(dir: &Path) {
    for top in ["bin", "lib", "lib64", "sbin"] {
        std::fs::create_dir_all(dir.join("usr").join(top)).unwrap();
        std::os::unix::fs::symlink(format!("usr/{top}"), dir.join(top)).unwrap();
    }
    for empty in ["etc", "tmp", "dev", "proc", "sys", "workspace"] {
        std::fs::create_dir_all(dir.join(empty)).unwrap();
    }
    for file in ["etc/hosts", "etc/hostname", "etc/resolv.conf"] {
        std::fs::write(dir.join(file), "").unwrap();
    }
    let mut files = std::collections::BTreeSet::new();
    for tool in [
        "sh", "cat", "cp", "mkdir", "dirname", "chown", "stat", "id", "true", "ls",
    ] {
        let path = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{tool} is not installed"));
        let ldd = Command::new("ldd").arg(&path).output().unwrap();
        for word in text(&ldd.stdout).split_whitespace() {
            if word.starts_with('/') {
                files.insert(PathBuf::from(word));
            }
        }
        files.insert(path);
    }
    for file in files {
        // Into /usr: the top-level names are symlinks to it in this root.
        let relative = file.strip_prefix("/").unwrap();
        let relative = match relative.components().next() {
            Some(c)
                if ["bin", "lib", "lib64", "sbin"].contains(&c.as_os_str().to_str().unwrap()) =>
            {
                Path::new("usr").join(relative)
            }
            _ => relative.to_path_buf(),
        };
        let target = dir.join(relative);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(&file, &target).unwrap();
    }
}

/// Imports a small shell root as image `name`.
fn import_shell_image(store: &TempStore, name: &str) {
    let tree = tempfile::tempdir().unwrap();
    shell_root(tree.path());
    let out = store.image(&["import", name, tree.path().to_str().unwrap()]);
    assert!(out.status.success(), "import: {out:?}");
}

#[test]
fn recipe_errors_exit_125_with_one_line_and_change_nothing() {
    let store = TempStore::new();
    if is_root() {
        import_shell_image(&store, "base");
    }
    let outer = tempfile::tempdir().unwrap();
    let dir = outer.path().join("recipe");
    std::fs::create_dir_all(dir.join("files")).unwrap();
    std::fs::write(dir.join("files/ok"), "ok").unwrap();
    std::fs::write(outer.path().join("secret"), "secret").unwrap();
    std::os::unix::fs::symlink("../../secret", dir.join("files/link")).unwrap();
    let copy = |src: &str, dst: &str| {
        format!("[base]\nimage = \"base\"\n[[copy]]\nsrc = \"{src}\"\ndst = \"{dst}\"\n")
    };
    let cases = [
        (
            "[base]\nimage = \"base\"\npakages = [\"x\"]\n".to_string(),
            "line 3: unknown field `pakages`",
        ),
        (
            "[base]\nimage = \"base\"\n[config]\nuser = \"1000\"\nworkdri = \"/w\"\n".into(),
            "unknown field `workdri`",
        ),
        (
            "[base]\nimage = \"no-such-base\"\n".into(),
            "no image named 'no-such-base'",
        ),
        (
            "[base]\ndebian = \"bookworm\"\nimage = \"base\"\n".into(),
            "exclude each other",
        ),
        ("[config]\ncmd = [\"sh\"]\n".into(), "missing field `base`"),
        (copy("../secret", "/x"), "outside the recipe's directory"),
        (copy("files/link", "/x"), "outside the recipe's directory"),
        (copy("files/missing", "/x"), "files/missing"),
        (copy("files/ok", "etc/ok"), "must be an absolute path"),
        (copy("files/ok", "/tmp/ok"), "below /tmp"),
        (
            "[base]\nimage = \"base\"\napt = [\"python3; rm -rf /\"]\n".into(),
            "base.apt: package 'python3; rm -rf /' contains ';'",
        ),
        (
            "[base]\nimage = \"base\"\npip = [\"\"]\n".into(),
            "empty package name",
        ),
    ];
    let before = store.listing();
    for (recipe, expected) in cases {
        let path = dir.join("recipe.toml");
        std::fs::write(&path, &recipe).unwrap();
        let out = store.build("built", &path, &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{recipe}\n{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{recipe}\n{stderr}");
        assert!(
            stderr.contains(expected),
            "{recipe}\nwanted {expected:?} in {stderr}"
        );
        assert_eq!(store.listing(), before, "{recipe} changed the store");
    }
    let out = store.build("built", &dir.join("none.toml"), &[]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("cannot read"), "{out:?}");
    assert_eq!(store.listing(), before);
}

#[test]
fn root_build_on_an_image_with_copy_run_and_config() {
    require_root!();
    let store = TempStore::new();
    import_shell_image(&store, "base");

    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    std::fs::create_dir_all(files.join("app/sub")).unwrap();
    std::fs::write(files.join("app/sub/data.txt"), "app data\n").unwrap();
    std::fs::set_permissions(
        files.join("app/sub/data.txt"),
        std::os::unix::fs::PermissionsExt::from_mode(0o640),
    )
    .unwrap();
    std::fs::write(files.join("greeting"), "hello from the recipe\n").unwrap();
    // Copies belong to the image's root whoever owns them on the host.
    std::os::unix::fs::chown(files.join("greeting"), Some(4321), Some(4321)).unwrap();
    let recipe = dir.path().join("recipe.toml");
    std::fs::write(
        &recipe,
        r#"
[base]
image = "base"
run = [
    "mkdir -p /opt/built && echo built > /opt/built/b.txt && chown 1234:2345 /opt/built/b.txt",
    "true",
    "cat /etc/greeting > /opt/built/seen-by-run.txt",
]

[[copy]]
src = "files/app"
dst = "/opt/app"

[[copy]]
src = "files/greeting"
dst = "/etc/greeting"

[config]
env = { GREETING = "hi" }
user = "1000"
workdir = "/srv/work"
cmd = ["sh", "-c", "echo \"$GREETING from $(pwd) as $(id -u)\"; cat /etc/greeting"]
"#,
    )
    .unwrap();

    let out = store.build("app", &recipe, &[]);
    assert!(out.status.success(), "build: {}", text(&out.stderr));
    let image = store.inspect("app");
    // base, the copies, two runs that wrote, the workdir; `true` wrote nothing.
    assert_eq!(image["layers"].as_array().unwrap().len(), 5, "{image:#}");
    assert_eq!(image["config"]["env"], serde_json::json!(["GREETING=hi"]));
    assert_eq!(image["config"]["user"], "1000");
    assert_eq!(image["config"]["workdir"], "/srv/work");
    assert_eq!(image["config"]["cmd"][0], "sh");
    assert!(image["origin"].as_str().unwrap().starts_with("build "));
    let listing = store.listing();
    let images: Vec<_> = listing
        .iter()
        .filter(|n| n.starts_with("images/"))
        .collect();
    assert_eq!(images.len(), 2, "no intermediate records stay: {listing:?}");

    // The image's own command, env, user and working directory.
    let out = store.run("app", &[], &[]);
    assert_eq!(
        text(&out.stdout),
        "hi from /srv/work as 1000\nhello from the recipe\n",
        "{out:?}"
    );

    let out = store.run(
        "app",
        &["--user", "0"],
        &[
            "sh",
            "-c",
            "cat /opt/app/sub/data.txt /opt/built/b.txt /opt/built/seen-by-run.txt; \
             stat -c '%n %u:%g %a' /etc/greeting /opt/app/sub/data.txt /opt/built/b.txt",
        ],
    );
    assert_eq!(
        text(&out.stdout),
        "app data\nbuilt\nhello from the recipe\n\
         /etc/greeting 0:0 644\n/opt/app/sub/data.txt 0:0 640\n/opt/built/b.txt 65534:65534 644\n",
        "{out:?}"
    );
    // On disk the layers keep real ownership: the chown of the run step, root for
    // copies. (A sandbox maps only the image's root, so it saw 1234 as nobody.)
    let copies = store.layer_mount(&image, 1);
    let run = store.layer_mount(&image, 2);
    let meta = std::fs::metadata(copies.join("etc/greeting")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (0, 0));
    let meta = std::fs::metadata(run.join("opt/built/b.txt")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1234, 2345));
    assert!(!copies.join("tmp/brig-copy").exists());
    assert!(store.layer_mount(&image, 4).join("srv/work").is_dir());

    // A name in use needs --replace.
    let out = store.build("app", &recipe, &[]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("already exists"), "{out:?}");
    let out = store.build("app", &recipe, &["--replace"]);
    assert!(out.status.success(), "rebuild: {}", text(&out.stderr));

    // A failing step: its output's tail in one line, and no image recorded.
    let failing = dir.path().join("failing.toml");
    std::fs::write(
        &failing,
        "[base]\nimage = \"app\"\nrun = [\"echo written > /opt/x\", \"echo 'E: something broke' >&2; exit 7\"]\n",
    )
    .unwrap();
    let before: Vec<_> = store
        .listing()
        .into_iter()
        .filter(|n| n.starts_with("images/"))
        .collect();
    let out = store.build("broken", &failing, &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    let last = stderr.trim().lines().last().unwrap();
    assert!(
        last.starts_with("brig: step 2/2 (run echo 'E: something broke'")
            && last.ends_with("failed: exit status 7: E: something broke"),
        "{stderr}"
    );
    let after: Vec<_> = store
        .listing()
        .into_iter()
        .filter(|n| n.starts_with("images/"))
        .collect();
    assert_eq!(after, before);
    // Its work directory went with it (lock files may stay: see store.rs).
    let debris: Vec<_> = std::fs::read_dir(store.path().join("tmp"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_none_or(|e| e != "lock"))
        .collect();
    assert!(debris.is_empty(), "{debris:?}");
}

/// Builds the standard image from images/python.toml (Debian via debootstrap,
/// packages from Debian and PyPI: several minutes and the network) and uses the
/// tools it promises.
#[test]
fn root_slow_python_image_builds_and_runs_its_tools() {
    require_root!();
    let store = TempStore::new();
    let recipe = Path::new(env!("CARGO_MANIFEST_DIR")).join("images/python.toml");
    let started = std::time::Instant::now();
    let out = store.build("python", &recipe, &[]);
    assert!(out.status.success(), "build: {}", text(&out.stderr));
    eprintln!(
        "built python in {:.0}s:\n{}",
        started.elapsed().as_secs_f64(),
        text(&out.stderr)
    );
    let image = store.inspect("python");
    assert_eq!(image["config"]["user"], "1000");
    assert_eq!(image["config"]["workdir"], "/workspace");
    assert_eq!(image["config"]["cmd"], serde_json::json!(["python3"]));

    // The default command is python3, as uid 1000 in /workspace.
    let mut child = brig()
        .args(["run", "--image", "python", "--store"])
        .arg(store.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(b"import os; print(os.getuid(), os.getcwd(), os.environ['MPLBACKEND'])\n")
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(text(&out.stdout), "1000 /workspace Agg\n", "{out:?}");

    let program = r#"
import json, subprocess
import numpy, pandas, matplotlib, pypdf, pdfplumber, reportlab, pypdfium2
import matplotlib.pyplot as plt
from reportlab.pdfgen import canvas

SENTENCE = "The quick brown fox jumps over the lazy dog"
result = {}

pdf = canvas.Canvas("doc.pdf")
pdf.setFont("Helvetica", 14)
pdf.drawString(72, 720, SENTENCE)
pdf.save()
result["pdftotext"] = subprocess.run(
    ["pdftotext", "doc.pdf", "-"], capture_output=True, text=True, check=True
).stdout
result["pypdf"] = pypdf.PdfReader("doc.pdf").pages[0].extract_text()
with pdfplumber.open("doc.pdf") as doc:
    result["pdfplumber"] = doc.pages[0].extract_text()
page = pypdfium2.PdfDocument("doc.pdf")[0]
result["pdfium_width"] = page.render(scale=1).to_pil().size[0]

fig = plt.figure(figsize=(9, 1.2), dpi=200)
fig.text(0.02, 0.35, SENTENCE, fontsize=22)
fig.savefig("text.png", facecolor="white")
result["ocr"] = subprocess.run(
    ["tesseract", "text.png", "stdout"], capture_output=True, text=True, check=True
).stdout

frame = pandas.DataFrame({"x": numpy.arange(10), "y": numpy.arange(10) ** 2})
ax = frame.plot(x="x", y="y")
ax.figure.savefig("plot.png")
with open("plot.png", "rb") as f:
    data = f.read()
result["plot"] = [data[:8].hex(), len(data)]
print(json.dumps(result))
"#;
    let out = store.run(
        "python",
        &["--timeout", "3m", "--memory", "1G"],
        &["python3", "-c", program],
    );
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // The font cache was built into the image, not in this sandbox.
    assert!(!stderr.contains("font cache"), "{stderr}");
    let result: Value = serde_json::from_str(stdout.trim()).unwrap();
    let sentence = "The quick brown fox jumps over the lazy dog";
    for tool in ["pdftotext", "pypdf", "pdfplumber"] {
        assert_eq!(result[tool].as_str().unwrap().trim(), sentence, "{tool}");
    }
    // reportlab's default page is A4, 595.3 points wide: as many pixels at 72 dpi.
    let width = result["pdfium_width"].as_u64().unwrap();
    assert!((595..=596).contains(&width), "{width}");
    let ocr = result["ocr"].as_str().unwrap().to_lowercase();
    for word in sentence.to_lowercase().split(' ') {
        assert!(ocr.contains(word), "OCR missed {word:?}: {ocr:?}");
    }
    assert_eq!(result["plot"][0], "89504e470d0a1a0a", "a PNG");
    assert!(result["plot"][1].as_u64().unwrap() > 10_000);
}
