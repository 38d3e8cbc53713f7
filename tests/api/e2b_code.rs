//! E2B's code-interpreter API (port 49999), served by brig's interpreter: what
//! e2b-code-interpreter reads, and the errors E2B's server answers with. The real
//! SDK runs against it in tests/e2b/test_code.py.

use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

use crate::common::daemon::{agent, Daemon};
use crate::support::{create, daemon, sid};
use serde_json::{json, Value};

/// A request to port 49999 of sandbox `id`: (status, body).
fn call(d: &Daemon, id: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let url = format!("http://{}{path}", d.addr());
    let agent = agent();
    let headers = [
        ("E2b-Sandbox-Id", id),
        ("E2b-Sandbox-Port", "49999"),
        ("X-API-Key", d.admin_key()),
    ];
    let response = match (method, body) {
        ("POST", body) => {
            let mut request = agent.post(&url).header("Content-Type", "application/json");
            for (name, value) in headers {
                request = request.header(name, value);
            }
            request.send(body.unwrap_or_default().as_bytes())
        }
        (method, None) => {
            let mut request = match method {
                "GET" => agent.get(&url),
                _ => agent.delete(&url),
            };
            for (name, value) in headers {
                request = request.header(name, value);
            }
            request.call()
        }
        (method, Some(_)) => panic!("{method} with a body"),
    };
    let mut response = response.expect("request");
    let status = response.status().as_u16();
    (status, response.body_mut().read_to_string().unwrap())
}

/// The lines of an `/execute` answer, keepalives left out.
fn execute(d: &Daemon, id: &str, body: Value) -> Vec<Value> {
    let (status, text) = call(d, id, "POST", "/execute", Some(&body.to_string()));
    assert_eq!(status, 200, "{text}");
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["type"] != "keepalive")
        .collect()
}

fn context(d: &Daemon, id: &str, body: &str) -> String {
    let (status, text) = call(d, id, "POST", "/contexts", Some(body));
    assert_eq!(status, 200, "{text}");
    let ctx: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(ctx["language"], "python");
    ctx["id"].as_str().unwrap().to_string()
}

#[test]
fn execute_streams_e2b_lines_keeps_state_per_context_and_ends_each_run() {
    let d = daemon(&[]);
    let id = sid(&create(&d, d.admin_key(), json!({})));
    let ctx = context(&d, &id, r#"{"cwd": "/workspace"}"#);

    let lines = execute(
        &d,
        &id,
        json!({"code": "import os\nprint(os.getcwd())\nx = 41\nos.environ['ONLY_NOW']",
               "context_id": ctx, "env_vars": {"ONLY_NOW": "yes"}}),
    );
    // Output may come in any number of pieces, each a line of its own.
    let stdout: String = lines
        .iter()
        .filter(|l| l["type"] == "stdout")
        .map(|l| l["text"].as_str().unwrap())
        .collect();
    assert_eq!(stdout, "/workspace\n", "{lines:?}");
    assert!(lines[0]["timestamp"].is_string());
    let rest: Vec<&Value> = lines.iter().filter(|l| l["type"] != "stdout").collect();
    let types: Vec<&str> = rest.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        ["result", "number_of_executions", "end_of_execution"],
        "{lines:?}"
    );
    // A str's repr comes back as the string itself, as E2B's server gives it.
    assert_eq!(rest[0]["text"], "yes");
    assert_eq!(rest[0]["is_main_result"], true);
    assert_eq!(rest[1]["execution_count"], 1);

    // State is kept; the variables set for one run are not.
    let lines = execute(
        &d,
        &id,
        json!({"code": "import os; (x + 1, os.environ.get('ONLY_NOW'))", "context_id": ctx}),
    );
    assert_eq!(lines[0]["text"], "(42, None)", "{lines:?}");

    // An error keeps E2B's fields; the count goes on.
    let lines = execute(&d, &id, json!({"code": "1/0", "context_id": ctx}));
    assert_eq!(lines[0]["type"], "error", "{lines:?}");
    assert_eq!(lines[0]["name"], "ZeroDivisionError");
    assert_eq!(lines[0]["value"], "division by zero");
    assert!(lines[0]["traceback"]
        .as_str()
        .unwrap()
        .contains("ZeroDivisionError"));
    assert_eq!(lines[1]["execution_count"], 3);

    // IPython's shell escapes, in code that is not Python as it is; a program that
    // is Python keeps its meaning.
    let lines = execute(
        &d,
        &id,
        json!({"code": "!echo shell $((6 * 7))\ny = 'a\\n!b'", "context_id": ctx}),
    );
    let stdout: String = lines
        .iter()
        .filter(|l| l["type"] == "stdout")
        .map(|l| l["text"].as_str().unwrap())
        .collect();
    assert_eq!(stdout, "shell 42\n", "{lines:?}");
    let lines = execute(
        &d,
        &id,
        json!({"code": "s = '''\n!x\n'''\ns", "context_id": ctx}),
    );
    assert_eq!(lines[0]["text"], "\\n!x\\n", "{lines:?}");

    // Another context has its own state.
    let other = context(&d, &id, r#"{"cwd": "/tmp", "language": "python"}"#);
    let lines = execute(
        &d,
        &id,
        json!({"code": "'x' in dir()", "context_id": other}),
    );
    assert_eq!(lines[0]["text"], "False", "{lines:?}");

    // The default context starts in E2B's home: on the host's dirs, the workspace.
    let lines = execute(&d, &id, json!({"code": "import os; os.getcwd()"}));
    assert_eq!(lines[0]["text"], "/workspace", "{lines:?}");

    // Listed, restarted (state gone), removed.
    let (status, text) = call(&d, &id, "GET", "/contexts", None);
    assert_eq!(status, 200);
    let listed: Vec<Value> = serde_json::from_str(&text).unwrap();
    let ids: Vec<&str> = listed.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert!(
        ids.contains(&ctx.as_str()) && ids.contains(&other.as_str()),
        "{listed:?}"
    );
    assert!(listed.iter().all(|c| c["language"] == "python"));
    let (status, _) = call(&d, &id, "POST", &format!("/contexts/{ctx}/restart"), None);
    assert_eq!(status, 200);
    let lines = execute(&d, &id, json!({"code": "x", "context_id": ctx}));
    assert_eq!(lines[0]["name"], "NameError", "{lines:?}");
    let (status, _) = call(&d, &id, "DELETE", &format!("/contexts/{other}"), None);
    assert_eq!(status, 200);
    let (status, text) = call(&d, &id, "DELETE", &format!("/contexts/{other}"), None);
    assert_eq!(
        (status, text.as_str()),
        (404, format!("Context {other} not found").as_str())
    );
}

#[test]
fn execute_refuses_as_e2b_server_does() {
    let d = daemon(&[]);
    let id = sid(&create(&d, d.admin_key(), json!({})));
    let cases: [(&str, u16, &str); 7] = [
        ("{}", 422, "missing"),
        (r#"{"code": 1}"#, 422, "string_type"),
        ("not json", 422, "json_invalid"),
        (r#"{"code": "1", "env_vars": [1]}"#, 422, "dict_type"),
        (r#"{"code": "1", "language": "js"}"#, 400, "no js kernel"),
        (
            r#"{"code": "1", "language": "python", "context_id": "c"}"#,
            400,
            "Only one of",
        ),
        (r#"{"code": "1", "context_id": "nosuch"}"#, 404, "nosuch"),
    ];
    for (body, status, says) in cases {
        let (got, text) = call(&d, &id, "POST", "/execute", Some(body));
        assert_eq!(got, status, "{body}: {text}");
        assert!(text.contains(says), "{body}: {text}");
        if status == 422 {
            let detail: Value = serde_json::from_str(&text).unwrap();
            assert!(detail["detail"][0]["loc"][0] == "body", "{text}");
        }
    }
    let (status, text) = call(&d, &id, "POST", "/contexts/nosuch/restart", None);
    assert_eq!((status, text.as_str()), (404, "Context nosuch not found"));
    let (status, _) = call(&d, &id, "GET", "/nothing-here", None);
    assert_eq!(status, 404);
}

/// A client that gives up on a run (the SDK's `timeout`) frees its context: the
/// code is interrupted, and the next run does not wait behind it.
#[test]
fn an_abandoned_run_is_interrupted_so_the_next_one_runs() {
    let d = daemon(&[]);
    let id = sid(&create(&d, d.admin_key(), json!({})));
    let ctx = context(&d, &id, r#"{"cwd": "/workspace"}"#);
    let body = json!({"code": "import time\ntime.sleep(600)", "context_id": ctx}).to_string();
    let mut stream = std::net::TcpStream::connect(d.addr()).unwrap();
    write!(
        stream,
        "POST /execute HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: {id}\r\nE2b-Sandbox-Port: 49999\r\n\
         X-API-Key: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        d.admin_key(),
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    assert!(status.contains(" 200 "), "{status}");
    drop(reader);
    stream.shutdown(std::net::Shutdown::Both).unwrap();
    drop(stream);

    let started = Instant::now();
    let lines = execute(&d, &id, json!({"code": "1 + 1", "context_id": ctx}));
    assert_eq!(lines[0]["text"], "2", "{lines:?}");
    // The sleep was 600 s; anything far below that means it was interrupted.
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        lines[1]["execution_count"], 2,
        "the interrupted run counted"
    );
}

/// Where the image has E2B's chart extractor (`e2b-charts`, in brig's python image),
/// a figure's result carries its `chart`; brig's own chart description stays out of
/// E2B's `extra`. Here a stand-in extractor is on the sandbox's PYTHONPATH.
#[test]
fn a_figure_carries_e2b_charts_data_where_the_image_has_it() {
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(
        &d,
        &key,
        json!({"env": {"PYTHONPATH": "/workspace/site"}}),
    ));
    let stand_in = b"def chart_figure_to_dict(fig):\n    \
        return {'type': 'line', 'title': fig.axes[0].get_title(), 'elements': []}\n";
    let (status, body) = d.raw(
        "PUT",
        &crate::support::files_url(&id, "/workspace/site/e2b_charts/__init__.py"),
        Some(&key),
        None,
        Some(stand_in.to_vec()),
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let ctx = context(&d, &id, r#"{"cwd": "/workspace"}"#);
    let lines = execute(
        &d,
        &id,
        json!({"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4])\n\
                        plt.title('up')\nplt.show()", "context_id": ctx}),
    );
    let result = lines
        .iter()
        .find(|l| l["type"] == "result")
        .unwrap_or_else(|| panic!("no result: {lines:?}"));
    assert_eq!(
        result["chart"],
        json!({"type": "line", "title": "up", "elements": []})
    );
    assert!(result["png"]
        .as_str()
        .is_some_and(|p| p.starts_with("iVBOR")));
    assert_eq!(result["extra"], json!({}));
}
