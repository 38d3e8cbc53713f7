//! Compressed tar streams, recognised by their magic bytes: file names and media
//! types lie too often (docker has shipped gzip layers labelled as plain tar).

use std::io::{self, BufRead, Cursor, Read};

use crate::{ImageError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compression {
    None,
    Gzip,
    Zstd,
}

const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];
const XZ_MAGIC: &[u8] = &[0xfd, b'7', b'z', b'X', b'Z', 0x00];
const BZIP2_MAGIC: &[u8] = b"BZh";
const SNIFF_LEN: u64 = 6;

/// A stream whose first bytes have been read to recognise its compression.
pub(crate) struct Sniffed<R> {
    pub kind: Compression,
    head: Vec<u8>,
    rest: R,
}

impl<R: BufRead> Sniffed<R> {
    /// Errors are the reader's own; a format brig cannot read is `Unsupported`.
    pub fn new(mut rest: R) -> Result<Self, SniffError> {
        let mut head = Vec::with_capacity(SNIFF_LEN as usize);
        (&mut rest)
            .take(SNIFF_LEN)
            .read_to_end(&mut head)
            .map_err(SniffError::Read)?;
        let kind = if head.starts_with(GZIP_MAGIC) {
            Compression::Gzip
        } else if head.starts_with(ZSTD_MAGIC) {
            Compression::Zstd
        } else if head.starts_with(XZ_MAGIC) {
            return Err(SniffError::Unsupported("xz"));
        } else if head.starts_with(BZIP2_MAGIC) {
            return Err(SniffError::Unsupported("bzip2"));
        } else {
            Compression::None
        };
        Ok(Sniffed { kind, head, rest })
    }

    /// The decompressed stream, starting from the first byte.
    pub fn decoder<'a>(self) -> io::Result<Box<dyn Read + 'a>>
    where
        R: 'a,
    {
        // The sniffed bytes go back in front so decoders see the whole stream.
        let whole = Cursor::new(self.head).chain(self.rest);
        Ok(match self.kind {
            Compression::None => Box::new(whole),
            // Multi-member, because parallel compressors (pigz) write several members.
            Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(whole)),
            Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(whole)?),
        })
    }
}

#[derive(Debug)]
pub(crate) enum SniffError {
    Read(io::Error),
    Unsupported(&'static str),
}

impl From<SniffError> for ImageError {
    fn from(err: SniffError) -> Self {
        match err {
            SniffError::Read(e) => super::read_error(e),
            SniffError::Unsupported(format) => ImageError::Unsupported(format!(
                "{format}-compressed archives are not supported (use plain, gzip or zstd)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn roundtrip(data: &[u8]) -> (Compression, Vec<u8>) {
        let sniffed = Sniffed::new(io::BufReader::new(data)).unwrap();
        let kind = sniffed.kind;
        let mut out = Vec::new();
        sniffed.decoder().unwrap().read_to_end(&mut out).unwrap();
        (kind, out)
    }

    #[test]
    fn recognises_formats_by_content() {
        let plain = b"hello, plain world".to_vec();
        assert_eq!(roundtrip(&plain), (Compression::None, plain.clone()));

        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&plain).unwrap();
        assert_eq!(
            roundtrip(&gz.finish().unwrap()),
            (Compression::Gzip, plain.clone())
        );

        let zst = zstd::encode_all(&plain[..], 1).unwrap();
        assert_eq!(roundtrip(&zst), (Compression::Zstd, plain.clone()));
    }

    #[test]
    fn short_and_empty_streams_are_plain() {
        assert_eq!(roundtrip(b""), (Compression::None, Vec::new()));
        assert_eq!(roundtrip(b"\x1f"), (Compression::None, b"\x1f".to_vec()));
    }

    #[test]
    fn concatenated_gzip_members_are_one_stream() {
        let mut data = Vec::new();
        for part in [&b"first "[..], b"second"] {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(part).unwrap();
            data.extend(gz.finish().unwrap());
        }
        assert_eq!(roundtrip(&data).1, b"first second");
    }

    #[test]
    fn xz_is_refused_by_name() {
        let err: ImageError = Sniffed::new(io::BufReader::new(&b"\xfd7zXZ\x00rest"[..]))
            .err()
            .unwrap()
            .into();
        assert!(
            matches!(err, ImageError::Unsupported(ref m) if m.contains("xz")),
            "{err}"
        );
    }
}
