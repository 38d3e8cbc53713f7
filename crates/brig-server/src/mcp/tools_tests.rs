//! The tools over a scripted workspace: arguments, answers, failures.

use super::*;
use crate::mcp::{CodeSummary, Failure};

/// A workspace that records what it was asked and answers from a script.
#[derive(Default)]
struct Fake {
    asked: std::sync::Mutex<Vec<String>>,
    output: CommandOutput,
    file: Vec<u8>,
    ran: Option<CodeSummary>,
}

impl Workspace for Fake {
    async fn run_command(
        &self,
        _: Option<Caller>,
        command: String,
        timeout_ms: Option<u64>,
    ) -> Result<CommandOutput, Failure> {
        self.asked
            .lock()
            .unwrap()
            .push(format!("run {command} {timeout_ms:?}"));
        Ok(self.output.clone())
    }
    async fn write_file(
        &self,
        _: Option<Caller>,
        path: String,
        content: String,
    ) -> Result<u64, Failure> {
        self.asked.lock().unwrap().push(format!("write {path}"));
        Ok(content.len() as u64)
    }
    async fn read_file(
        &self,
        _: Option<Caller>,
        path: String,
        limit: u64,
    ) -> Result<Result<Vec<u8>, u64>, Failure> {
        self.asked.lock().unwrap().push(format!("read {path}"));
        if self.file.len() as u64 > limit {
            return Ok(Err(self.file.len() as u64));
        }
        Ok(Ok(self.file.clone()))
    }
    async fn list_files(&self, _: Option<Caller>, path: String) -> Result<Vec<Entry>, Failure> {
        self.asked.lock().unwrap().push(format!("list {path}"));
        Err(Failure {
            code: "no_such_file".into(),
            message: format!("{path}: no such file or directory"),
        })
    }
    async fn run_code(
        &self,
        _: Option<Caller>,
        code: String,
        timeout_ms: Option<u64>,
    ) -> Result<CodeSummary, Failure> {
        self.asked
            .lock()
            .unwrap()
            .push(format!("code {code} {timeout_ms:?}"));
        self.ran.clone().ok_or_else(|| Failure {
            code: "not_found".into(),
            message: "no script".into(),
        })
    }
    async fn snapshot(&self, _: Option<Caller>, name: Option<String>) -> Result<String, Failure> {
        self.asked
            .lock()
            .unwrap()
            .push(format!("snapshot {name:?}"));
        Ok("snap_1".into())
    }
    async fn restore(&self, _: Option<Caller>, snapshot_id: String) -> Result<(), Failure> {
        self.asked
            .lock()
            .unwrap()
            .push(format!("restore {snapshot_id}"));
        Ok(())
    }
    async fn close(&self) {}
}

fn summary(results: Vec<brig_engine::interpreter::CodeResult>) -> CodeSummary {
    CodeSummary {
        stdout: "hello\n".into(),
        stderr: String::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        results,
        results_truncated: false,
        error: None,
        context_id: "default".into(),
        execution_count: 3,
        timed_out: false,
        duration_ms: 5,
    }
}

fn result(pairs: &[(&str, &str)], main: bool) -> brig_engine::interpreter::CodeResult {
    brig_engine::interpreter::CodeResult {
        data: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect(),
        main,
    }
}

#[tokio::test]
async fn run_code_returns_output_values_and_charts_as_images() {
    let fake = Fake {
        ran: Some(summary(vec![
            result(
                &[("text/plain", "<Figure>"), ("image/png", "iVBORw0KGgo=")],
                false,
            ),
            result(&[("text/plain", "2"), ("text/html", "<b>2</b>")], true),
        ])),
        ..Fake::default()
    };
    let Value::Object(arguments) = json!({"code": "1+1", "timeout_ms": 500}) else {
        unreachable!()
    };
    let answer = call(&fake, None, "run_code", &arguments).await.unwrap();
    assert_ne!(answer.is_error, Some(true));
    let text: String = answer
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    assert!(
        text.contains("hello") && text.contains("--- result ---\n2"),
        "{text}"
    );
    assert_eq!(
        answer
            .content
            .iter()
            .filter(|c| c.as_image().is_some())
            .count(),
        1
    );
    assert_eq!(*fake.asked.lock().unwrap(), ["code 1+1 Some(500)"]);
}

#[tokio::test]
async fn run_code_errors_and_timeouts_are_tool_errors_with_the_traceback() {
    let mut failed = summary(Vec::new());
    failed.error = Some(brig_engine::interpreter::CodeError {
        name: "ZeroDivisionError".into(),
        value: "division by zero".into(),
        traceback: "line 1, in <cell>".into(),
    });
    let (error, text) = run(
        &Fake {
            ran: Some(failed),
            ..Fake::default()
        },
        "run_code",
        json!({"code": "1/0"}),
    )
    .await;
    assert!(error, "{text}");
    assert!(
        text.contains("ZeroDivisionError: division by zero") && text.contains("line 1"),
        "{text}"
    );
    let mut slow = summary(Vec::new());
    slow.timed_out = true;
    let (error, text) = run(
        &Fake {
            ran: Some(slow),
            ..Fake::default()
        },
        "run_code",
        json!({"code": "while True: pass"}),
    )
    .await;
    assert!(error && text.contains("state is kept"), "{text}");
    for (arguments, named) in [
        (json!({}), "code"),
        (json!({"code": 5}), "code"),
        (json!({"code": "1", "timeout_ms": -1}), "timeout_ms"),
        (json!({"code": "1", "cell": 2}), "cell"),
    ] {
        let fake = Fake::default();
        let (error, text) = run(&fake, "run_code", arguments).await;
        assert!(error && text.contains(named), "{text}");
        assert!(fake.asked.lock().unwrap().is_empty());
    }
}

async fn run(fake: &Fake, name: &str, arguments: Value) -> (bool, String) {
    let Value::Object(arguments) = arguments else {
        panic!("arguments are an object")
    };
    let result = call(fake, None, name, &arguments).await.unwrap();
    let text = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<String>();
    (result.is_error == Some(true), text)
}

#[tokio::test]
async fn invalid_arguments_are_tool_errors_naming_the_argument_and_do_nothing() {
    let fake = Fake::default();
    for (name, arguments, named) in [
        ("run_command", json!({}), "command"),
        ("run_command", json!({"command": 1}), "command"),
        ("run_command", json!({"command": "  "}), "command"),
        (
            "run_command",
            json!({"command": "ls", "timeout_ms": 0}),
            "timeout_ms",
        ),
        (
            "run_command",
            json!({"command": "ls", "timeout_ms": 1.5}),
            "timeout_ms",
        ),
        ("run_command", json!({"command": "ls", "cwd": "/"}), "cwd"),
        ("write_file", json!({"content": "x"}), "path"),
        ("write_file", json!({"path": "", "content": "x"}), "path"),
        (
            "write_file",
            json!({"path": "a\u{0}b", "content": "x"}),
            "path",
        ),
        ("read_file", json!({"path": {"a": 1}}), "path"),
        ("list_files", json!({"path": false}), "path"),
    ] {
        let (error, text) = run(&fake, name, arguments.clone()).await;
        assert!(error, "{name} {arguments}: {text}");
        assert!(
            text.contains(&format!("`{named}`")),
            "{name} {arguments}: {text}"
        );
    }
    assert!(fake.asked.lock().unwrap().is_empty());
}

#[tokio::test]
async fn an_unknown_tool_is_a_protocol_error() {
    let fake = Fake::default();
    assert!(call(&fake, None, "rm_rf", &JsonObject::new())
        .await
        .is_err());
}

#[tokio::test]
async fn a_failed_command_is_a_tool_error_that_says_how_it_ended() {
    let mut fake = Fake {
        output: CommandOutput {
            exit_code: Some(2),
            stdout: "partial".into(),
            ..CommandOutput::default()
        },
        ..Fake::default()
    };
    let (error, text) = run(&fake, "run_command", json!({"command": "false"})).await;
    assert!(error);
    assert!(text.starts_with("command failed: exit code 2"), "{text}");
    assert!(text.contains("partial"), "{text}");
    fake.output = CommandOutput {
        signal: Some(9),
        ..CommandOutput::default()
    };
    let (error, text) = run(&fake, "run_command", json!({"command": "x"})).await;
    assert!(error && text.contains("signal 9"), "{text}");
    fake.output.exit_code = Some(0);
    let (error, text) = run(
        &fake,
        "run_command",
        json!({"command": "x", "timeout_ms": 5}),
    )
    .await;
    assert!(!error && text.starts_with("exit code 0"), "{text}");
    assert_eq!(fake.asked.lock().unwrap().last().unwrap(), "run x Some(5)");
}

#[tokio::test]
async fn paths_are_under_workspace_unless_absolute_and_binary_files_are_not_shown() {
    let mut fake = Fake {
        file: b"hello".to_vec(),
        ..Fake::default()
    };
    assert_eq!(
        run(&fake, "read_file", json!({"path": "a.txt"})).await,
        (false, "hello".to_string())
    );
    run(&fake, "read_file", json!({"path": "/etc/x"})).await;
    let (error, text) = run(&fake, "list_files", json!({})).await;
    assert!(error && text.contains("(no_such_file)"), "{text}");
    assert_eq!(
        *fake.asked.lock().unwrap(),
        ["read /workspace/a.txt", "read /etc/x", "list /workspace"]
    );
    fake.file = vec![0, 159, 146, 150];
    let (error, text) = run(&fake, "read_file", json!({"path": "b"})).await;
    assert!(error && text.contains("binary"), "{text}");
    fake.file = vec![b'a'; READ_LIMIT as usize + 1];
    let (error, text) = run(&fake, "read_file", json!({"path": "c"})).await;
    assert!(error && text.contains("run_command"), "{text}");
}
