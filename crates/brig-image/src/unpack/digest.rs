//! OCI content digests (`sha256:<hex>`) and a reader that computes one on the way.

use std::fmt;
use std::io::{self, Read};

use sha2::{Digest as _, Sha256};

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Digest([u8; 32]);

impl Digest {
    /// Parses `sha256:<64 lowercase hex>`; the error says what is wrong with it.
    ///
    /// Only sha256 is accepted: it is what every image tool writes, and a digest
    /// that parses is safe to use as a file name (`blobs/sha256/<hex>`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let (algorithm, encoded) = text
            .split_once(':')
            .ok_or_else(|| format!("digest '{text}' is not of the form 'algorithm:hex'"))?;
        if algorithm != "sha256" {
            return Err(format!(
                "digest '{text}' uses {algorithm}; only sha256 is supported"
            ));
        }
        let mut bytes = [0u8; 32];
        let lowercase = encoded
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !lowercase || hex::decode_to_slice(encoded, &mut bytes).is_err() {
            return Err(format!("digest '{text}' is not 64 lowercase hex digits"));
        }
        Ok(Digest(bytes))
    }

    pub fn of(data: &[u8]) -> Self {
        Digest(Sha256::digest(data).into())
    }

    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Where an OCI layout (and a docker 25+ save) keeps this blob.
    pub fn blob_path(&self) -> String {
        format!("blobs/sha256/{}", self.hex())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Hashes every byte read through it.
pub(crate) struct Hashing<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Hashing<R> {
    pub fn new(inner: R) -> Self {
        Hashing {
            inner,
            hasher: Sha256::new(),
        }
    }

    /// The digest of everything read so far.
    pub fn digest(&self) -> Digest {
        Digest(self.hasher.clone().finalize().into())
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn parses_and_prints_sha256() {
        let d = Digest::parse(EMPTY).unwrap();
        assert_eq!(d, Digest::of(b""));
        assert_eq!(d.to_string(), EMPTY);
        assert_eq!(d.blob_path(), format!("blobs/sha256/{}", &EMPTY[7..]));
    }

    #[test]
    fn rejects_what_could_not_be_a_file_name() {
        for bad in [
            "e3b0c442",
            "sha512:abcd",
            "sha256:../../etc/passwd",
            "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
            "sha256:e3b0",
        ] {
            assert!(Digest::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hashing_reader_digests_what_passes_through() {
        let mut r = Hashing::new(&b"abc"[..]);
        io::copy(&mut r, &mut io::sink()).unwrap();
        assert_eq!(r.digest(), Digest::of(b"abc"));
    }
}
