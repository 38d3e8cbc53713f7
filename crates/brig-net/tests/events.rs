//! The proxy served on plain loopback listeners (no namespace, no root): every
//! connection and DNS answer produces one `EgressEvent` with what the daemon audits.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use brig_net::{Decision, Egress, EgressEvent, Limits, Resolver, Sockets, Via};
use brig_policy::net::{EgressMode, EgressPolicy};

struct Proxy {
    http: std::net::SocketAddr,
    dns: std::net::SocketAddr,
    events: Arc<Mutex<Vec<EgressEvent>>>,
    _runtime: tokio::runtime::Runtime,
}

fn proxy() -> Proxy {
    proxy_with(Vec::new())
}

fn proxy_with(secrets: Vec<brig_net::Secret>) -> Proxy {
    let http = TcpListener::bind("127.0.0.1:0").unwrap();
    let socks = TcpListener::bind("127.0.0.1:0").unwrap();
    let dns = UdpSocket::bind("127.0.0.1:0").unwrap();
    http.set_nonblocking(true).unwrap();
    socks.set_nonblocking(true).unwrap();
    dns.set_nonblocking(true).unwrap();
    let (http_addr, dns_addr) = (http.local_addr().unwrap(), dns.local_addr().unwrap());
    let events: Arc<Mutex<Vec<EgressEvent>>> = Arc::default();
    let sink = events.clone();
    let policy = EgressPolicy {
        mode: EgressMode::Allow,
        allow: vec!["good.test".parse().unwrap()],
        deny: vec![],
        allow_private: vec!["127.0.0.0/8".parse().unwrap()],
    };
    let hosts = HashMap::from([
        ("good.test".to_string(), vec!["127.0.0.1".parse().unwrap()]),
        ("bad.test".to_string(), vec!["127.0.0.1".parse().unwrap()]),
    ]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    brig_net::spawn(
        runtime.handle(),
        Egress {
            policy,
            resolver: Resolver::Hosts(hosts),
            limits: Limits::default(),
            events: Some(Arc::new(move |e: &EgressEvent| {
                sink.lock().unwrap().push(e.clone())
            })),
            secrets: brig_net::Secrets {
                list: secrets,
                ..Default::default()
            },
        },
        Sockets {
            http: http.into(),
            socks: socks.into(),
            dns: dns.into(),
            capture: None,
        },
    )
    .unwrap();
    Proxy {
        http: http_addr,
        dns: dns_addr,
        events,
        _runtime: runtime,
    }
}

/// An upstream that echoes one connection.
fn echo() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = listener.accept() {
            let mut buf = [0u8; 1024];
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 || s.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    });
    port
}

fn wait_for(events: &Mutex<Vec<EgressEvent>>, n: usize) -> Vec<EgressEvent> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen = events.lock().unwrap().clone();
        if seen.len() >= n || Instant::now() > deadline {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn connect(proxy: &Proxy, target: &str) -> (TcpStream, String) {
    let mut s = TcpStream::connect(proxy.http).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "CONNECT {target} HTTP/1.1\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap() == 1 {
        head.push(byte[0]);
    }
    (s, String::from_utf8_lossy(&head).into_owned())
}

#[test]
fn an_allowed_tunnel_is_one_event_with_its_address_and_bytes() {
    let proxy = proxy();
    let port = echo();
    let (mut s, head) = connect(&proxy, &format!("good.test:{port}"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s.write_all(b"12345").unwrap();
    let mut back = [0u8; 5];
    s.read_exact(&mut back).unwrap();
    drop(s);
    let events = wait_for(&proxy.events, 1);
    let e = &events[0];
    assert_eq!((e.via, e.decision), (Via::Connect, Decision::Allowed));
    assert_eq!((e.host.as_str(), e.port), ("good.test", port));
    assert_eq!(e.addr, Some(format!("127.0.0.1:{port}").parse().unwrap()));
    assert_eq!((e.bytes_up, e.bytes_down), (5, 5));
}

#[test]
fn a_refusal_is_one_event_with_its_reason() {
    let proxy = proxy();
    let (_, head) = connect(&proxy, "bad.test:80");
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    let events = wait_for(&proxy.events, 1);
    let e = &events[0];
    assert_eq!(
        (e.decision, e.reason.as_str()),
        (Decision::Refused, "not_allowed")
    );
    assert_eq!((e.host.as_str(), e.port, e.addr), ("bad.test", 80, None));
}

#[test]
fn a_dns_answer_is_an_event_too() {
    let proxy = proxy();
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut query = vec![0, 7, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in ["bad", "test"] {
        query.push(label.len() as u8);
        query.extend(label.as_bytes());
    }
    query.extend([0, 0, 1, 0, 1]);
    client.send_to(&query, proxy.dns).unwrap();
    let mut answer = [0u8; 512];
    let n = client.recv(&mut answer).unwrap();
    assert!(n >= 12 && answer[3] & 0xf == 3, "NXDOMAIN");
    let events = wait_for(&proxy.events, 1);
    assert_eq!(
        (events[0].via, events[0].decision),
        (Via::Dns, Decision::Refused)
    );
    assert_eq!(events[0].host, "bad.test");
}

#[test]
fn a_placeholder_toward_another_host_is_an_exfiltration_event_without_the_value() {
    let secret =
        brig_net::Secret::new("TOKEN", "v4lue-xyz".into(), &["api.test".to_string()]).unwrap();
    let placeholder = secret.placeholder().to_string();
    let proxy = proxy_with(vec![secret]);
    let port = echo();
    let mut s = TcpStream::connect(proxy.http).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET http://good.test:{port}/?k={placeholder} HTTP/1.1\r\nHost: good.test\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(
        answer.contains("TOKEN") && answer.contains("api.test"),
        "{answer}"
    );
    let events = wait_for(&proxy.events, 1);
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e.decision, Decision::Refused);
    assert_eq!(e.reason, "secret_exfiltration");
    assert_eq!(e.secret.as_deref(), Some("TOKEN"));
    assert_eq!(e.addr, None, "refused before any connection");
    assert!(!format!("{e:?}").contains("v4lue"));
}

#[test]
fn a_plain_request_counts_the_head_brig_sent_upstream() {
    let proxy = proxy();
    let port = echo();
    let mut s = TcpStream::connect(proxy.http).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let request = format!("GET http://good.test:{port}/ HTTP/1.1\r\nHost: x\r\n\r\n");
    s.write_all(request.as_bytes()).unwrap();
    let mut back = Vec::new();
    let mut buf = [0u8; 1024];
    while !back.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "{back:?}");
        back.extend_from_slice(&buf[..n]);
    }
    drop(s);
    let events = wait_for(&proxy.events, 1);
    let e = &events[0];
    assert_eq!(e.reason, "allowed");
    // The echo upstream sent back exactly what brig sent it.
    assert_eq!(e.bytes_up, back.len() as u64, "{events:?}");
}
