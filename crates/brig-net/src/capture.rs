//! Transparent capture: inside the sandbox's namespace, TCP to a synthetic address
//! (which the DNS resolver gave an allowed name) is redirected to this listener
//! (see `brig_jail::net::Capture`). The original destination comes from
//! `SO_ORIGINAL_DST` and is mapped back to its name; then it is decided like any
//! proxied connection. A connection that was not redirected has no original
//! destination and is closed.

use std::net::{IpAddr, Ipv4Addr};

use nix::sys::socket::{getsockopt, sockopt::OriginalDst};
use tokio::net::TcpStream;

use crate::dial::{dial, Host};
use crate::relay::{close_gently, tunnel, Pending, Via};
use crate::Shared;

pub(crate) async fn handle(shared: &Shared, mut stream: TcpStream) {
    let mut event = Pending::new(Via::Capture);
    let original = match getsockopt(&stream, OriginalDst) {
        Ok(sin) => (
            Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
            u16::from_be(sin.sin_port),
        ),
        Err(_) => {
            event.refused(shared, "not_redirected");
            return close_gently(stream).await;
        }
    };
    let (ip, port) = original;
    event.port = port;
    event.host = ip.to_string();
    let host = Host::Ip(IpAddr::V4(ip));
    let name = match crate::dial::named(shared, &host) {
        Ok(Some(name)) if shared.synth.covers(IpAddr::V4(ip)) => name,
        _ => {
            event.refused(shared, "not_a_synthetic_address");
            return close_gently(stream).await;
        }
    };
    event.host = name.clone();
    match dial(shared, &Host::Name(name.clone()), port).await {
        Ok((upstream, addr)) => {
            event.addr = Some(addr);
            tunnel(shared, event, &mut stream, upstream, Some(&name), port).await;
        }
        Err((failure, addr)) => {
            event.addr = addr.map(|a| std::net::SocketAddr::new(a, port));
            tracing::info!("{}", failure.message(&name, port));
            event.refused(shared, failure.code());
            close_gently(stream).await;
        }
    }
}
