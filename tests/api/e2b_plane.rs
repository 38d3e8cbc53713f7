//! E2B's sandbox plane: requests naming a sandbox in `E2b-Sandbox-Id` are routed by
//! `E2b-Sandbox-Port`, whatever their path, and refused as E2B's edge refuses them.

use crate::support::{create, daemon, exchange, sid, tenant_key};
use serde_json::json;

#[test]
fn sandbox_plane_requests_are_routed_by_header_and_refused_as_e2b_refuses() {
    let d = daemon(&[]);
    let (alice, _) = tenant_key(&d, "alice");
    let (bob, _) = tenant_key(&d, "bob");
    let id = sid(&create(&d, &alice, json!({})));
    let head = |path: &str, extra: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}")
            .trim_end()
            .to_string()
    };

    // An unknown sandbox: E2B's 502, whatever the credentials.
    let (status, body) = exchange(
        d.addr(),
        &head(
            "/health",
            "E2b-Sandbox-Id: nosuch\r\nE2b-Sandbox-Port: 49983",
        ),
        b"",
    );
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["code"], 502);
    assert_eq!(body["sandboxId"], "nosuch");

    // Another tenant's sandbox is one that does not exist.
    let (status, body) = exchange(
        d.addr(),
        &head(
            "/files?path=/etc/hostname",
            &format!("E2b-Sandbox-Id: {id}\r\nE2b-Sandbox-Port: 49983\r\nX-API-Key: {bob}"),
        ),
        b"",
    );
    assert_eq!((status, &body["code"]), (502, &json!(502)), "{body}");

    // No credentials, or a wrong token: 401 in E2B's shape.
    for extra in ["", "X-Access-Token: 00ff\r\n", "X-Access-Token: nothex\r\n"] {
        let (status, body) = exchange(
            d.addr(),
            &head(
                "/files?path=/etc/hostname",
                &format!("E2b-Sandbox-Id: {id}\r\nE2b-Sandbox-Port: 49983\r\n{extra}"),
            ),
            b"",
        );
        assert_eq!(
            (status, &body["code"]),
            (401, &json!(401)),
            "{extra}: {body}"
        );
    }

    // A port the sandbox serves nothing on, and one that is no port.
    let (status, body) = exchange(
        d.addr(),
        &head(
            "/",
            &format!("E2b-Sandbox-Id: {id}\r\nE2b-Sandbox-Port: 8080\r\nX-API-Key: {alice}"),
        ),
        b"",
    );
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["port"], 8080);
    assert_eq!(
        body["message"],
        "The sandbox is running but port is not open"
    );
    let (status, body) = exchange(
        d.addr(),
        &head(
            "/",
            &format!("E2b-Sandbox-Id: {id}\r\nE2b-Sandbox-Port: http\r\nX-API-Key: {alice}"),
        ),
        b"",
    );
    assert_eq!((status, &body["code"]), (400, &json!(400)), "{body}");

    // Without the header, the same path is brig's own.
    let (status, body) = exchange(d.addr(), &head("/health", ""), b"");
    assert_eq!((status, &body["status"]), (200, &json!("ok")), "{body}");
}
