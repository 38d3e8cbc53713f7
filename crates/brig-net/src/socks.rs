//! SOCKS5 (RFC 1928): no authentication, CONNECT only, to a domain name, an IPv4 or
//! an IPv6 address. A refusal is reply code 2 ("not allowed by ruleset"); SOCKS has
//! no room for the reason, which the log and the event carry.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::dial::{dial, Failure, Host};
use crate::relay::{close_gently, tunnel, Pending, Via};
use crate::Shared;

const NOT_ALLOWED: u8 = 2;
const HOST_UNREACHABLE: u8 = 4;
const CONNECTION_REFUSED: u8 = 5;
const COMMAND_NOT_SUPPORTED: u8 = 7;
const ADDRESS_NOT_SUPPORTED: u8 = 8;

fn reply(code: u8) -> [u8; 10] {
    [5, code, 0, 1, 0, 0, 0, 0, 0, 0]
}

/// The greeting and the request: the target, or the reply to send before closing.
async fn handshake(stream: &mut TcpStream) -> Result<(Host, u16), Option<[u8; 10]>> {
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).await.map_err(|_| None)?;
    if head[0] != 5 {
        // Not SOCKS5 (SOCKS4, HTTP, garbage): "no acceptable method" and close.
        let _ = stream.write_all(&[5, 0xff]).await;
        return Err(None);
    }
    let mut methods = vec![0u8; usize::from(head[1])];
    stream.read_exact(&mut methods).await.map_err(|_| None)?;
    if !methods.contains(&0) {
        let _ = stream.write_all(&[5, 0xff]).await;
        return Err(None);
    }
    stream.write_all(&[5, 0]).await.map_err(|_| None)?;
    let mut req = [0u8; 4];
    stream.read_exact(&mut req).await.map_err(|_| None)?;
    if req[0] != 5 || req[2] != 0 {
        return Err(Some(reply(1)));
    }
    let host = match req[3] {
        1 => {
            let mut a = [0u8; 4];
            stream.read_exact(&mut a).await.map_err(|_| None)?;
            Host::Ip(IpAddr::V4(Ipv4Addr::from(a)))
        }
        4 => {
            let mut a = [0u8; 16];
            stream.read_exact(&mut a).await.map_err(|_| None)?;
            Host::Ip(IpAddr::V6(Ipv6Addr::from(a)))
        }
        3 => {
            let mut len = [0u8; 1];
            stream.read_exact(&mut len).await.map_err(|_| None)?;
            let mut name = vec![0u8; usize::from(len[0])];
            stream.read_exact(&mut name).await.map_err(|_| None)?;
            match String::from_utf8(name) {
                // A name that is an IP in text is still an IP.
                Ok(name) => Host::parse(&name),
                Err(_) => Host::Name("\u{fffd}".into()),
            }
        }
        _ => return Err(Some(reply(ADDRESS_NOT_SUPPORTED))),
    };
    let mut port = [0u8; 2];
    stream.read_exact(&mut port).await.map_err(|_| None)?;
    if req[1] != 1 {
        return Err(Some(reply(COMMAND_NOT_SUPPORTED)));
    }
    Ok((host, u16::from_be_bytes(port)))
}

pub(crate) async fn handle(shared: &Shared, mut stream: TcpStream) {
    let mut event = Pending::new(Via::Socks);
    let (host, port) =
        match tokio::time::timeout(shared.limits.handshake, handshake(&mut stream)).await {
            Ok(Ok(target)) => target,
            Ok(Err(answer)) => {
                if let Some(answer) = answer {
                    let _ = stream.write_all(&answer).await;
                }
                event.refused(shared, "protocol_error");
                return close_gently(stream).await;
            }
            Err(_) => {
                event.refused(shared, "protocol_error");
                return close_gently(stream).await;
            }
        };
    event.host = host.to_string();
    event.port = port;
    let name = crate::dial::named(shared, &host).ok().flatten();
    let (upstream, addr) = match dial(shared, &host, port).await {
        Ok(ok) => ok,
        Err((failure, addr)) => {
            event.addr = addr.map(|a| std::net::SocketAddr::new(a, port));
            let code = match &failure {
                Failure::Refused(_) => NOT_ALLOWED,
                Failure::Unresolved(_) => HOST_UNREACHABLE,
                Failure::Unreachable(_) => CONNECTION_REFUSED,
            };
            tracing::info!("{}", failure.message(&event.host, port));
            let _ = stream.write_all(&reply(code)).await;
            event.refused(shared, failure.code());
            return close_gently(stream).await;
        }
    };
    event.addr = Some(addr);
    if stream.write_all(&reply(0)).await.is_err() {
        return;
    }
    tunnel(shared, event, &mut stream, upstream, name.as_deref(), port).await;
}
