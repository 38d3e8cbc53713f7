//! Loop devices, for kernels that cannot mount an image file directly.
//!
//! Hand-written because the maintained crates generate their bindings with bindgen
//! (a libclang build dependency) for a handful of ioctls.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};

use rustix::ioctl::NoArg;

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;
const LOOP_SET_CAPACITY: rustix::ioctl::Opcode = rustix::ioctl::opcode::none(0x4C, 0x07);
const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// A loop device attached to a file, with autoclear: the kernel detaches it when
/// its last user (the mount) goes away.
pub struct LoopDevice {
    device: File,
    pub path: PathBuf,
}

impl LoopDevice {
    pub fn attach_read_only(backing: BorrowedFd<'_>) -> io::Result<LoopDevice> {
        Self::attach(backing, true)
    }

    pub fn attach(backing: BorrowedFd<'_>, read_only: bool) -> io::Result<LoopDevice> {
        let flags = if read_only {
            LO_FLAGS_READ_ONLY | LO_FLAGS_AUTOCLEAR
        } else {
            LO_FLAGS_AUTOCLEAR
        };
        let control = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/loop-control")?;
        // Another process may take the free device between the two calls: retry.
        for _ in 0..16 {
            // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a number.
            let number = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
            if number < 0 {
                return Err(io::Error::last_os_error());
            }
            let path = PathBuf::from(format!("/dev/loop{number}"));
            // A device opened read-only is configured read-only, whatever the flags.
            let device = OpenOptions::new()
                .read(true)
                .write(!read_only)
                .open(&path)?;
            let config = LoopConfig {
                fd: backing.as_raw_fd() as u32,
                block_size: 0,
                info: LoopInfo64 {
                    lo_device: 0,
                    lo_inode: 0,
                    lo_rdevice: 0,
                    lo_offset: 0,
                    lo_sizelimit: 0,
                    lo_number: 0,
                    lo_encrypt_type: 0,
                    lo_encrypt_key_size: 0,
                    lo_flags: flags,
                    lo_file_name: [0; 64],
                    lo_crypt_name: [0; 64],
                    lo_encrypt_key: [0; 32],
                    lo_init: [0; 2],
                },
                reserved: [0; 8],
            };
            // SAFETY: `config` is a properly laid out `struct loop_config` that lives
            // across the call; the kernel only reads it.
            let ret = unsafe {
                libc::ioctl(
                    device.as_raw_fd(),
                    LOOP_CONFIGURE,
                    &config as *const LoopConfig,
                )
            };
            if ret == 0 {
                return Ok(LoopDevice { device, path });
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EBUSY) {
                return Err(err);
            }
        }
        Err(io::Error::other("no free loop device after 16 tries"))
    }

    /// The bound loop device whose backing file is `backing` (same device and inode),
    /// if there is one. A file must never back two devices that are both mounted
    /// read-write: two filesystems would write one image.
    pub fn find(backing: &File) -> io::Result<Option<PathBuf>> {
        use std::os::unix::fs::MetadataExt;
        let meta = backing.metadata()?;
        for entry in std::fs::read_dir("/sys/block")? {
            let name = entry?.file_name();
            let Some(name) = name.to_str().filter(|n| n.starts_with("loop")) else {
                continue;
            };
            // Only a bound device has a backing file.
            if !Path::new("/sys/block")
                .join(name)
                .join("loop/backing_file")
                .exists()
            {
                continue;
            }
            let path = PathBuf::from(format!("/dev/{name}"));
            let Ok(device) = OpenOptions::new().read(true).open(&path) else {
                continue;
            };
            // SAFETY: LoopInfo64 is plain old data; all zeroes is a valid value.
            let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
            // SAFETY: LOOP_GET_STATUS64 writes one `struct loop_info64` into `info`,
            // which lives across the call.
            let ret = unsafe {
                libc::ioctl(
                    device.as_raw_fd(),
                    LOOP_GET_STATUS64,
                    &mut info as *mut LoopInfo64,
                )
            };
            // ENXIO: unbound since it was listed.
            if ret == 0 && info.lo_device == meta.dev() && info.lo_inode == meta.ino() {
                return Ok(Some(path));
            }
        }
        Ok(None)
    }

    /// Makes the bound device at `path` take the current size of its backing file
    /// (after the file grew), without detaching it from the filesystem it carries.
    pub fn set_capacity(path: &Path) -> io::Result<()> {
        // Opened read-only: a block device that is mounted may refuse to be opened
        // for writing (BLK_DEV_WRITE_MOUNTED), and root may resize it anyway.
        let device = OpenOptions::new().read(true).open(path)?;
        // SAFETY: LOOP_SET_CAPACITY takes no argument.
        unsafe { rustix::ioctl::ioctl(&device, NoArg::<LOOP_SET_CAPACITY>::new()) }
            .map_err(Into::into)
    }

    /// Detaches now; for when the mount that would trigger autoclear failed.
    pub fn detach(self) -> io::Result<()> {
        // SAFETY: LOOP_CLR_FD takes no argument.
        let ret = unsafe { libc::ioctl(self.device.as_raw_fd(), LOOP_CLR_FD) };
        if ret < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}
