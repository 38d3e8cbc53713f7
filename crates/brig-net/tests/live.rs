//! A proxy served with `spawn_live` (as the daemon serves a session's): a replaced
//! policy decides new connections and leaves open ones alone, and dropping the
//! `Serving` closes the listeners but not the connections under way. Plain
//! loopback listeners, no namespace, no root.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

use brig_net::{Limits, LiveEgress, LivePolicy, Resolver, Sockets};
use brig_policy::net::{EgressMode, EgressPolicy};

fn policy(allow: &str) -> EgressPolicy {
    EgressPolicy {
        mode: EgressMode::Allow,
        allow: vec![allow.parse().unwrap()],
        deny: vec![],
        allow_private: vec!["127.0.0.0/8".parse().unwrap()],
    }
}

/// An upstream that echoes every connection.
fn echo() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

fn connect(proxy: std::net::SocketAddr, target: &str) -> (TcpStream, String) {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "CONNECT {target} HTTP/1.1\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap() == 1 {
        head.push(byte[0]);
    }
    (s, String::from_utf8_lossy(&head).into_owned())
}

fn echoes(s: &mut TcpStream) -> bool {
    s.write_all(b"ping\n").unwrap();
    let mut got = [0u8; 5];
    s.read_exact(&mut got).is_ok() && &got == b"ping\n"
}

#[test]
fn a_replaced_policy_and_closed_listeners_leave_open_connections_alone() {
    let http = TcpListener::bind("127.0.0.1:0").unwrap();
    let socks = TcpListener::bind("127.0.0.1:0").unwrap();
    let dns = UdpSocket::bind("127.0.0.1:0").unwrap();
    for s in [&http, &socks] {
        s.set_nonblocking(true).unwrap();
    }
    dns.set_nonblocking(true).unwrap();
    let addr = http.local_addr().unwrap();
    let hosts = HashMap::from([
        ("a.test".to_string(), vec!["127.0.0.1".parse().unwrap()]),
        ("b.test".to_string(), vec!["127.0.0.1".parse().unwrap()]),
    ]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let port = echo();
    let live = LivePolicy::new(policy(&format!("a.test:{port}")), None);
    let serving = brig_net::spawn_live(
        runtime.handle(),
        LiveEgress {
            policy: live.clone(),
            resolver: Resolver::Hosts(hosts),
            limits: Limits::default(),
            events: None,
            secrets: Default::default(),
        },
        Sockets {
            http: http.into(),
            socks: socks.into(),
            dns: dns.into(),
            capture: None,
        },
    )
    .unwrap();
    let (mut open, head) = connect(addr, &format!("a.test:{port}"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(echoes(&mut open));

    live.replace(policy(&format!("b.test:{port}")), None);
    let (_, head) = connect(addr, &format!("a.test:{port}"));
    assert!(
        head.contains(" 403 "),
        "a new connection is decided anew: {head}"
    );
    let (mut other, head) = connect(addr, &format!("b.test:{port}"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(echoes(&mut open), "the open tunnel keeps going");

    drop(serving);
    let refused = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        TcpStream::connect(addr).is_err()
    });
    assert!(
        refused,
        "the listener still accepts after its Serving was dropped"
    );
    assert!(
        echoes(&mut open) && echoes(&mut other),
        "tunnels outlive the listener"
    );
}
