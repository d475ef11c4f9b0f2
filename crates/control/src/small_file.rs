//! The files twill is given by name: flannel's network config, a kubeconfig and the files it
//! names, etcd's TLS files, the subnet file, the WireGuard key. Each is read only if it is a
//! regular file no longer than such a file ever is, so that a path naming /dev/zero, a FIFO or
//! an endless file is an error naming it at once, not a read that eats memory or never ends.

use std::fs::{Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// flannel's net-conf.json, a kubeconfig, a PEM bundle: far below this, all of them.
pub const CONFIG: u64 = 1 << 20;

/// The whole of `path`, a regular file of at most `max` bytes. Opened without blocking and
/// looked at before any read, so that a FIFO (which would wait for a writer) or a device
/// (which may never end) is refused at once; never more than `max` is read, should the file
/// grow after the look.
pub fn read(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    check(&meta, max)?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(too_long(max));
    }
    Ok(bytes)
}

/// [`read`], as UTF-8 text.
pub fn read_text(path: &Path, max: u64) -> io::Result<String> {
    String::from_utf8(read(path, max)?).map_err(|_| io::Error::other("it is not UTF-8 text"))
}

/// That `path` is a regular file of at most `max` bytes, for a file another library reads.
pub fn check_path(path: &Path, max: u64) -> io::Result<()> {
    check(&std::fs::metadata(path)?, max)
}

/// That `meta` is a regular file's of at most `max` bytes.
pub fn check(meta: &Metadata, max: u64) -> io::Result<()> {
    if !meta.is_file() {
        let why = format!("it is {}, not a regular file", kind(meta));
        return Err(io::Error::other(why));
    }
    if meta.len() > max {
        return Err(too_long(max));
    }
    Ok(())
}

fn too_long(max: u64) -> io::Error {
    io::Error::other(format!(
        "it is longer than {max} bytes, more than such a file holds"
    ))
}

/// What a file that is not a regular one is, for the error.
fn kind(meta: &Metadata) -> &'static str {
    let kind = meta.file_type();
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "something else"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_fifos_directories_and_long_files_are_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let long = dir.path().join("long");
        std::fs::write(&long, "x".repeat(2000)).unwrap();
        let cases = [
            (
                Path::new("/dev/zero"),
                "it is a character device, not a regular file",
            ),
            (&fifo, "it is a FIFO, not a regular file"),
            (dir.path(), "it is a directory, not a regular file"),
            (&long, "it is longer than 1000 bytes"),
        ];
        for (path, want) in cases {
            let started = std::time::Instant::now();
            let err = read(path, 1000).unwrap_err().to_string();
            assert!(started.elapsed().as_secs() < 1, "{err}");
            assert!(err.contains(want), "{}: {err}", path.display());
        }
        std::fs::write(&long, "ok").unwrap();
        assert_eq!(read_text(&long, 1000).unwrap(), "ok");
        assert!(check_path(Path::new("/dev/zero"), 1000).is_err());
    }
}
