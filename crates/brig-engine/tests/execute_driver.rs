//! The Python driver of `/v1/execute` (src/execute_driver.py), run directly with the
//! host's `python3` as the daemon runs it inside a sandbox:
//! `python3 -u execute_driver.py CODE_FILE 0|1` with cwd = the working directory.
//! Skipped, with a notice, where there is no python3.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

const DRIVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/execute_driver.py");

struct Run {
    stdout: String,
    stderr: String,
    code: Option<i32>,
}

fn have_python() -> bool {
    let found = Command::new("python3")
        .args(["-c", "pass"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        eprintln!("skipped: python3 is not installed");
    }
    found
}

/// Runs `code` through the driver in a fresh working directory; `setup` may put
/// files there first.
fn run_with(code: &str, interactive: bool, stdin: &str, setup: impl FnOnce(&Path)) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("workspace");
    std::fs::create_dir(&work).unwrap();
    setup(&work);
    // Outside the working directory, as the daemon does it.
    let code_file = dir.path().join("code.py");
    std::fs::write(&code_file, code).unwrap();
    let mut child = Command::new("python3")
        .arg("-u")
        .arg(DRIVER)
        .arg(&code_file)
        .arg(if interactive { "1" } else { "0" })
        .current_dir(&work)
        .env_remove("MPLBACKEND")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        code: out.status.code(),
    }
}

fn run(code: &str) -> Run {
    run_with(code, true, "", |_| {})
}

/// Asserts a clean run printing exactly `stdout`.
fn assert_prints(code: &str, stdout: &str) {
    let out = run(code);
    assert_eq!(out.stdout, stdout, "code: {code:?}\nstderr: {}", out.stderr);
    assert_eq!(out.stderr, "", "code: {code:?}");
    assert_eq!(out.code, Some(0), "code: {code:?}");
}

#[test]
fn last_expression_is_displayed_like_the_repl() {
    if !have_python() {
        return;
    }
    assert_prints("1+1", "2\n");
    assert_prints("'text'", "'text'\n");
    assert_prints("x = 5\nx * 2", "10\n");
    // Multi-line expressions, and a trailing comment or blank lines after them.
    assert_prints("(1 +\n 2)", "3\n");
    assert_prints("{'a': [1,\n       2]}\n# done\n\n", "{'a': [1, 2]}\n");
    // Output written before the value comes first.
    assert_prints("print('a')\n2*3", "a\n6\n");
}

#[test]
fn nothing_is_displayed_for_statements_none_or_when_not_interactive() {
    if !have_python() {
        return;
    }
    assert_prints("x = 5", "");
    assert_prints("None", "");
    assert_prints("print('only')", "only\n");
    assert_prints("for i in range(2):\n    i", "");
    assert_prints("", "");
    let out = run_with("1+1", false, "", |_| {});
    assert_eq!((out.stdout.as_str(), out.code), ("", Some(0)));
}

#[test]
fn syntax_errors_print_like_python_and_exit_1() {
    if !have_python() {
        return;
    }
    let out = run("print('never')\nx = (1,");
    assert_eq!(out.code, Some(1));
    assert_eq!(out.stdout, "", "nothing runs");
    assert!(out.stderr.contains("SyntaxError"), "{}", out.stderr);
    assert!(
        out.stderr.contains("File \"<code>\", line 2"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("x = (1,"), "{}", out.stderr);
    assert!(!out.stderr.contains("Traceback"), "{}", out.stderr);
    assert!(!out.stderr.contains("execute_driver"), "{}", out.stderr);
    // Found by the compiler rather than the parser: still with the line.
    let out = run("x = 1\nreturn x");
    assert_eq!(out.code, Some(1));
    assert!(
        out.stderr.contains("line 2") && out.stderr.contains("return x"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("SyntaxError: 'return' outside function"),
        "{}",
        out.stderr
    );
}

#[test]
fn tracebacks_show_the_users_lines_not_the_driver() {
    if !have_python() {
        return;
    }
    let out = run("def f():\n    return 1/0\n\nf()");
    assert_eq!(out.code, Some(1));
    let err = &out.stderr;
    assert!(
        err.starts_with("Traceback (most recent call last):\n"),
        "{err}"
    );
    assert!(
        err.contains("File \"<code>\", line 4, in <module>\n    f()"),
        "{err}"
    );
    assert!(
        err.contains("File \"<code>\", line 2, in f\n    return 1/0"),
        "{err}"
    );
    assert!(
        err.ends_with("ZeroDivisionError: division by zero\n"),
        "{err}"
    );
    assert!(!err.contains("execute_driver"), "{err}");
    // Raised while displaying the last expression.
    let out = run("class R:\n    def __repr__(self):\n        raise ValueError('no')\nR()");
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("line 3, in __repr__"), "{}", out.stderr);
    assert!(!out.stderr.contains("execute_driver"), "{}", out.stderr);
}

#[test]
fn sys_exit_sets_the_status() {
    if !have_python() {
        return;
    }
    let out = run("import sys\nprint('before')\nsys.exit(3)\nprint('after')");
    assert_eq!((out.stdout.as_str(), out.code), ("before\n", Some(3)));
    assert_eq!(out.stderr, "");
    assert_eq!(run("import sys; sys.exit()").code, Some(0));
    let out = run("import sys; sys.exit('bye')");
    assert_eq!((out.stderr.as_str(), out.code), ("bye\n", Some(1)));
}

#[test]
fn the_code_runs_as_main() {
    if !have_python() {
        return;
    }
    assert_prints(
        "if __name__ == '__main__':\n    print('main ran')",
        "main ran\n",
    );
    assert_prints("import sys\nsys.argv", "['<code>']\n");
    // Functions and classes defined in the code pickle by reference to __main__.
    assert_prints(
        "import pickle\ndef f(x):\n    return x + 1\nclass C:\n    pass\n\
         g, c = pickle.loads(pickle.dumps((f, C())))\nprint(g(1), type(c).__name__)",
        "2 C\n",
    );
    assert_prints("import __main__\n__main__.__dict__ is globals()", "True\n");
}

#[test]
fn stdin_is_the_codes() {
    if !have_python() {
        return;
    }
    let out = run_with(
        "import sys\nprint(sys.stdin.read().upper(), end='')",
        true,
        "hello\nworld\n",
        |_| {},
    );
    assert_eq!((out.stdout.as_str(), out.code), ("HELLO\nWORLD\n", Some(0)));
}

#[test]
fn environment_of_the_code() {
    if !have_python() {
        return;
    }
    // Modules in the working directory are importable, as with `python3 -c`.
    let out = run_with("import helper\nhelper.VALUE", true, "", |work| {
        std::fs::write(work.join("helper.py"), "VALUE = 41 + 1\n").unwrap();
    });
    assert_eq!(
        (out.stdout.as_str(), out.code),
        ("42\n", Some(0)),
        "{}",
        out.stderr
    );
    // matplotlib draws off-screen unless told otherwise.
    assert_prints("import os\nos.environ['MPLBACKEND']", "'Agg'\n");
}
