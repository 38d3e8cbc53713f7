//! The server name (SNI) of a TLS ClientHello, read before any byte goes upstream,
//! so a tunnel opened for one allowed name cannot be used to ask the same address
//! for another (domain fronting).

use tokio::io::{AsyncRead, AsyncReadExt};

/// What the first TLS record said.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// A ClientHello naming this server (lowercase).
    Sni(String),
    /// A ClientHello without a server name.
    NoSni,
    /// Not a TLS ClientHello.
    NotTls,
}

/// Reads the first TLS record from `stream` (whole), returning it and what it says.
pub async fn read_hello<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<(Vec<u8>, Hello)> {
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).await?;
    let mut record = head.to_vec();
    if head[0] != 22 || head[1] != 3 {
        return Ok((record, Hello::NotTls));
    }
    let len = usize::from(u16::from_be_bytes([head[3], head[4]]));
    if len == 0 || len > 16_384 + 2048 {
        return Ok((record, Hello::NotTls));
    }
    record.resize(5 + len, 0);
    stream.read_exact(&mut record[5..]).await?;
    let hello = parse(&record[5..]).unwrap_or(Hello::NotTls);
    Ok((record, hello))
}

/// The handshake message inside one record.
fn parse(msg: &[u8]) -> Option<Hello> {
    let mut r = Reader(msg);
    if r.u8()? != 1 {
        return None; // not a ClientHello
    }
    let len = r.u24()?;
    // A ClientHello split over records: not seen from real clients' first flight
    // below 16 KiB; refused rather than half-read.
    let mut r = Reader(r.take(len)?);
    r.take(2 + 32)?; // version, random
    let sid = usize::from(r.u8()?);
    r.take(sid)?;
    let suites = usize::from(r.u16()?);
    r.take(suites)?;
    let comp = usize::from(r.u8()?);
    r.take(comp)?;
    if r.0.is_empty() {
        return Some(Hello::NoSni);
    }
    let ext_len = usize::from(r.u16()?);
    let mut exts = Reader(r.take(ext_len)?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let len = usize::from(exts.u16()?);
        let body = exts.take(len)?;
        if kind != 0 {
            continue;
        }
        let mut sni = Reader(body);
        let list = usize::from(sni.u16()?);
        let mut list = Reader(sni.take(list)?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let len = usize::from(list.u16()?);
            let name = list.take(len)?;
            if name_type == 0 {
                let name = std::str::from_utf8(name).ok()?;
                return Some(Hello::Sni(name.trim_end_matches('.').to_ascii_lowercase()));
            }
        }
        return None;
    }
    Some(Hello::NoSni)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]))
    }
}

/// A minimal ClientHello record naming `sni` (for tests: brig's own, and its black-box tests).
pub fn client_hello(sni: Option<&str>) -> Vec<u8> {
    let mut exts = Vec::new();
    if let Some(name) = sni {
        let name = name.as_bytes();
        let mut list = vec![0u8];
        list.extend((name.len() as u16).to_be_bytes());
        list.extend(name);
        let mut body = (list.len() as u16).to_be_bytes().to_vec();
        body.extend(list);
        exts.extend(0u16.to_be_bytes());
        exts.extend((body.len() as u16).to_be_bytes());
        exts.extend(body);
    }
    let mut hello = vec![3, 3];
    hello.extend([7u8; 32]);
    hello.push(0); // session id
    hello.extend(2u16.to_be_bytes());
    hello.extend([0x13, 0x01]);
    hello.extend([1, 0]); // compression: null
    hello.extend((exts.len() as u16).to_be_bytes());
    hello.extend(exts);
    let mut msg = vec![1];
    msg.extend(&(hello.len() as u32).to_be_bytes()[1..]);
    msg.extend(hello);
    let mut record = vec![22, 3, 1];
    record.extend((msg.len() as u16).to_be_bytes());
    record.extend(msg);
    record
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(bytes: &[u8]) -> Hello {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut input = bytes;
            read_hello(&mut input)
                .await
                .map(|(_, h)| h)
                .unwrap_or(Hello::NotTls)
        })
    }

    #[test]
    fn the_sni_of_a_client_hello_is_read() {
        assert_eq!(
            read(&client_hello(Some("Good.Test"))),
            Hello::Sni("good.test".into())
        );
        assert_eq!(read(&client_hello(None)), Hello::NoSni);
    }

    #[test]
    fn anything_else_is_not_tls() {
        assert_eq!(read(b"GET / HTTP/1.1\r\n\r\n"), Hello::NotTls);
        let mut truncated = client_hello(Some("a.test"));
        truncated.truncate(truncated.len() - 3);
        assert_eq!(read(&truncated), Hello::NotTls);
        let mut lying = client_hello(Some("a.test"));
        lying[6] = 0xff; // a ClientHello longer than its record
        assert_eq!(read(&lying), Hello::NotTls);
    }
}
