//! The DNS resolver at the address the sandbox's /etc/resolv.conf names (UDP).
//! It answers A questions for names the policy allows and that resolve, with a
//! synthetic address (see `synth`) that only brig's proxy and capture understand;
//! AAAA and other types get an empty answer (IPv4 is the way out); a name the
//! policy refuses, or that does not resolve, is NXDOMAIN. Malformed questions get
//! FORMERR, other opcodes NOTIMP. Nothing is ever forwarded: names leave the
//! sandbox only as brig's own lookups of allowed names.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::net::UdpSocket;

use crate::relay::{Decision, Pending, Via};
use crate::Shared;

const NOERROR: u8 = 0;
const FORMERR: u8 = 1;
const SERVFAIL: u8 = 2;
const NXDOMAIN: u8 = 3;
const NOTIMP: u8 = 4;
const TYPE_A: u16 = 1;
const CLASS_IN: u16 = 1;
/// Questions answered at once; past it, SERVFAIL.
const CONCURRENT: usize = 64;

/// A parsed question.
#[derive(Debug, PartialEq, Eq)]
pub struct Question {
    pub id: u16,
    pub rd: bool,
    pub name: String,
    pub qtype: u16,
    pub qclass: u16,
    /// The question section as received, echoed in the answer.
    pub raw: Vec<u8>,
}

/// What to answer a datagram: a question, or an error to send (`None`: nothing).
pub fn parse(packet: &[u8]) -> Result<Question, Option<Vec<u8>>> {
    if packet.len() < 12 {
        return Err((packet.len() >= 2).then(|| header(packet, FORMERR, 0, false)));
    }
    let flags = u16::from_be_bytes([packet[2], packet[3]]);
    if flags & 0x8000 != 0 {
        return Err(None); // a response: never answered, so never looped
    }
    let rd = flags & 0x0100 != 0;
    if (flags >> 11) & 0xf != 0 {
        return Err(Some(header(packet, NOTIMP, 0, rd)));
    }
    let formerr = || Some(header(packet, FORMERR, 0, rd));
    if u16::from_be_bytes([packet[4], packet[5]]) != 1 {
        return Err(formerr());
    }
    let mut at = 12;
    let mut labels: Vec<String> = Vec::new();
    loop {
        let len = usize::from(*packet.get(at).ok_or_else(formerr)?);
        at += 1;
        if len == 0 {
            break;
        }
        // Compression pointers have no place in a question.
        if len > 63 || at + len > packet.len() || at > 12 + 255 {
            return Err(formerr());
        }
        let label = &packet[at..at + len];
        if !label.is_ascii() {
            labels.push("\u{fffd}".into());
        } else {
            labels.push(String::from_utf8_lossy(label).into_owned());
        }
        at += len;
    }
    let fixed = packet.get(at..at + 4).ok_or_else(formerr)?;
    let qtype = u16::from_be_bytes([fixed[0], fixed[1]]);
    let qclass = u16::from_be_bytes([fixed[2], fixed[3]]);
    Ok(Question {
        id: u16::from_be_bytes([packet[0], packet[1]]),
        rd,
        name: labels.join("."),
        qtype,
        qclass,
        raw: packet[12..at + 4].to_vec(),
    })
}

/// A header-only answer.
fn header(packet: &[u8], rcode: u8, _unused: u16, rd: bool) -> Vec<u8> {
    let mut out = vec![packet[0], packet[1]];
    let flags: u16 = 0x8000 | if rd { 0x0100 } else { 0 } | 0x0080 | u16::from(rcode);
    out.extend(flags.to_be_bytes());
    out.extend([0u8; 8]);
    out
}

/// The answer to `q`: `rcode`, and an A record when `addr` is given.
pub fn answer(q: &Question, rcode: u8, addr: Option<Ipv4Addr>) -> Vec<u8> {
    let mut out = q.id.to_be_bytes().to_vec();
    let flags: u16 = 0x8000 | if q.rd { 0x0100 } else { 0 } | 0x0080 | u16::from(rcode);
    out.extend(flags.to_be_bytes());
    out.extend(1u16.to_be_bytes());
    out.extend(u16::from(addr.is_some()).to_be_bytes());
    out.extend([0u8; 4]);
    out.extend(&q.raw);
    if let Some(addr) = addr {
        out.extend([0xc0, 12]); // the question's name
        out.extend(TYPE_A.to_be_bytes());
        out.extend(CLASS_IN.to_be_bytes());
        out.extend(60u32.to_be_bytes());
        out.extend(4u16.to_be_bytes());
        out.extend(addr.octets());
    }
    out
}

pub(crate) async fn serve(socket: UdpSocket, shared: Arc<Shared>) {
    let socket = Arc::new(socket);
    let busy = Arc::new(tokio::sync::Semaphore::new(CONCURRENT));
    let mut buf = vec![0u8; 1500];
    loop {
        let (n, from) = match socket.recv_from(&mut buf).await {
            Ok(got) => got,
            Err(e) => {
                tracing::warn!("egress dns: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let question = match parse(&buf[..n]) {
            Ok(q) => q,
            Err(Some(error)) => {
                let _ = socket.send_to(&error, from).await;
                continue;
            }
            Err(None) => continue,
        };
        let Ok(permit) = busy.clone().try_acquire_owned() else {
            let _ = socket
                .send_to(&answer(&question, SERVFAIL, None), from)
                .await;
            continue;
        };
        let (socket, shared) = (socket.clone(), shared.clone());
        tokio::spawn(async move {
            let reply = respond(&shared, &question).await;
            let _ = send(&socket, &reply, from).await;
            drop(permit);
        });
    }
}

async fn send(socket: &UdpSocket, reply: &[u8], to: SocketAddr) -> std::io::Result<usize> {
    socket.send_to(reply, to).await
}

async fn respond(shared: &Shared, q: &Question) -> Vec<u8> {
    let mut event = Pending::new(Via::Dns);
    event.host = q.name.clone();
    if q.qclass != CLASS_IN {
        event.refused(shared, "not_class_in");
        return answer(q, NOTIMP, None);
    }
    let name = match shared.policy.check_name(&q.name, None) {
        Ok(name) => name,
        Err(refusal) => {
            tracing::info!("{}", refusal.message(&q.name, 0));
            event.refused(shared, refusal.code());
            return answer(q, NXDOMAIN, None);
        }
    };
    if let Err(why) = shared.resolver.lookup(&name).await {
        tracing::info!("egress dns: {why}");
        event.refused(shared, "unresolved");
        return answer(q, NXDOMAIN, None);
    }
    if q.qtype != TYPE_A {
        event.finish(
            shared,
            Decision::Allowed,
            "allowed, no records of this type",
            0,
            0,
        );
        return answer(q, NOERROR, None);
    }
    match shared.synth.address_of(&name) {
        Some(addr) => {
            event.addr = Some(SocketAddr::new(addr.into(), 0));
            event.finish(shared, Decision::Allowed, "allowed", 0, 0);
            answer(q, NOERROR, Some(addr))
        }
        None => {
            event.refused(shared, "synthetic_range_spent");
            answer(q, SERVFAIL, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut p = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            p.push(label.len() as u8);
            p.extend(label.as_bytes());
        }
        p.push(0);
        p.extend(qtype.to_be_bytes());
        p.extend(CLASS_IN.to_be_bytes());
        p
    }

    #[test]
    fn a_question_parses_and_its_answer_carries_one_a_record() {
        let q = parse(&query("Good.Test", TYPE_A)).unwrap();
        assert_eq!(
            (q.id, q.name.as_str(), q.qtype),
            (0x1234, "Good.Test", TYPE_A)
        );
        let a = answer(&q, NOERROR, Some(Ipv4Addr::new(198, 18, 0, 1)));
        assert_eq!(&a[..2], &[0x12, 0x34]);
        assert_eq!(a[3] & 0xf, NOERROR);
        assert_eq!(u16::from_be_bytes([a[6], a[7]]), 1);
        assert_eq!(&a[a.len() - 4..], &[198, 18, 0, 1]);
    }

    #[test]
    fn garbage_gets_formerr_or_nothing() {
        assert_eq!(parse(b"x").unwrap_err(), None);
        let short = parse(b"\x01\x02garbage").unwrap_err().unwrap();
        assert_eq!((short[0], short[1], short[3] & 0xf), (1, 2, FORMERR));
        let mut pointer = query("a.test", TYPE_A);
        pointer[12] = 0xc0;
        assert_eq!(parse(&pointer).unwrap_err().unwrap()[3] & 0xf, FORMERR);
        let mut truncated = query("a.test", TYPE_A);
        truncated.truncate(truncated.len() - 2);
        assert_eq!(parse(&truncated).unwrap_err().unwrap()[3] & 0xf, FORMERR);
        let mut response = query("a.test", TYPE_A);
        response[2] |= 0x80;
        assert_eq!(parse(&response).unwrap_err(), None);
        let mut update = query("a.test", TYPE_A);
        update[2] |= 5 << 3;
        assert_eq!(parse(&update).unwrap_err().unwrap()[3] & 0xf, NOTIMP);
    }
}
