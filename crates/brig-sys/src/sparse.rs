//! Writing files that keep their holes. brig copies and unpacks content that
//! untrusted code chose (archive members, decompressed layers, a sandbox's sparse
//! files in a snapshot): a few KiB can declare terabytes of zeros, and writing them
//! out would fill the disk (or a sandbox's tmpfs) with nothing.

use std::io::{self, Seek, SeekFrom, Write};

/// The block a run of zeros must fill to be left as a hole rather than written.
pub const HOLE_BLOCK: usize = 4096;

/// Writes `data` at the file's offset `offset` (a new file, written front to back),
/// skipping over blocks of zeros so they stay holes. Blocks are aligned to the
/// file's, whatever sizes the reads come in, and runs of data (or of holes) go out
/// in one call each. Returns whether `data` ended in a hole: if nothing follows, the
/// file's size must then be set.
pub fn write_keeping_holes<F: Write + Seek>(
    file: &mut F,
    data: &[u8],
    offset: u64,
) -> io::Result<bool> {
    let (mut at, mut pending_data, mut pending_hole) = (0usize, 0..0, 0i64);
    while at < data.len() {
        let into_block = (offset + at as u64) as usize % HOLE_BLOCK;
        let end = data.len().min(at + HOLE_BLOCK - into_block);
        let window = &data[at..end];
        // Zeros need not be written to a new file at all; the block is the unit only
        // so the runs are long. A block cut in two by the reads is skipped in two.
        if window.iter().all(|&b| b == 0) {
            file.write_all(&data[pending_data.clone()])?;
            pending_data = end..end;
            pending_hole += window.len() as i64;
        } else {
            if pending_hole > 0 {
                file.seek(SeekFrom::Current(pending_hole))?;
                pending_hole = 0;
            }
            if pending_data.is_empty() {
                pending_data = at..end;
            } else {
                pending_data.end = end;
            }
        }
        at = end;
    }
    file.write_all(&data[pending_data])?;
    if pending_hole > 0 {
        file.seek(SeekFrom::Current(pending_hole))?;
    }
    Ok(pending_hole > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    #[test]
    fn blocks_of_zeros_are_left_as_holes() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        let mut file = File::create(&path).unwrap();
        let mut data = vec![0u8; 64 << 20];
        data[HOLE_BLOCK + 7] = 1;
        // In pieces of odd sizes, as a decompressor hands them out.
        let data_len = data.len() - 100;
        let mut offset = 0;
        for piece in data[..data_len].chunks(12_345) {
            let _ = write_keeping_holes(&mut file, piece, offset).unwrap();
            offset += piece.len() as u64;
        }
        file.set_len((data.len() - 100) as u64).unwrap();
        drop(file);
        let read = std::fs::read(&path).unwrap();
        assert_eq!(read, &data[..data.len() - 100]);
        let meta = std::fs::metadata(&path).unwrap();
        assert!(meta.blocks() * 512 <= 64 << 10, "{} blocks", meta.blocks());
    }
}
