//! This node's WireGuard private key, kept in a file as flannel keeps it: `/run/flannel/wgkey`
//! (or `$WIREGUARD_KEY_FILE`), base64 text, mode 0400, made when missing and read ever after,
//! so the public key in our lease stays the same across restarts.

use crate::small_file;
use anyhow::{anyhow, Context};
use std::fs::{self, Metadata, OpenOptions};
use std::io::{self, ErrorKind, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use twill_dataplane::engine::wireguard::PrivateKey;

pub const DEFAULT_PATH: &str = "/run/flannel/wgkey";
/// flannel's variable for another path.
pub const PATH_ENV: &str = "WIREGUARD_KEY_FILE";
/// The most a key file may hold: a key is 44 characters of base64, and a file written by hand
/// may add a newline or some spaces. Nothing longer is read.
const MAX_LEN: u64 = 256;

/// Where the key file is: `$WIREGUARD_KEY_FILE`, else flannel's path.
pub fn path() -> PathBuf {
    std::env::var_os(PATH_ENV).map_or_else(|| PathBuf::from(DEFAULT_PATH), PathBuf::from)
}

/// The key in `path`, or a new one written there (mode 0400) when the file does not exist.
pub fn load_or_create(path: &Path) -> anyhow::Result<PrivateKey> {
    match read(path) {
        Ok(text) => parse(path, &text),
        Err(e) if e.kind() == ErrorKind::NotFound => create(path),
        Err(e) => Err(unreadable(path, &e)),
    }
}

fn unreadable(path: &Path, e: &io::Error) -> anyhow::Error {
    anyhow!("cannot read the WireGuard key file {}: {e}", path.display())
}

/// The text of a key file: a regular file of at most [`MAX_LEN`] bytes, so that a FIFO or a
/// device such as /dev/zero is refused at once ([`small_file`]).
fn read(path: &Path) -> io::Result<String> {
    let text = small_file::read_text(path, MAX_LEN)?;
    if let Ok(meta) = fs::metadata(path) {
        warn_if_readable_by_others(path, &meta);
    }
    Ok(text)
}

fn parse(path: &Path, text: &str) -> anyhow::Result<PrivateKey> {
    PrivateKey::from_base64(text.trim()).map_err(|e| {
        anyhow!(
            "the WireGuard key file {} holds no key ({e}); remove it to have a new one made",
            path.display()
        )
    })
}

fn create(path: &Path) -> anyhow::Result<PrivateKey> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let key = PrivateKey::generate();
    // create_new: of two processes racing to make the file, one writes it and both read it.
    let opened = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .open(path);
    let mut file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::AlreadyExists => return load_existing(path),
        Err(e) => return Err(anyhow!("cannot create {}: {e}", path.display())),
    };
    file.write_all(key.to_base64().as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))?;
    tracing::info!(path = %path.display(), "made a new WireGuard private key");
    Ok(key)
}

/// The file another process made while we were about to: read it, or fail.
fn load_existing(path: &Path) -> anyhow::Result<PrivateKey> {
    let text = read(path).map_err(|e| unreadable(path, &e))?;
    parse(path, &text)
}

fn warn_if_readable_by_others(path: &Path, meta: &Metadata) {
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        tracing::warn!(
            path = %path.display(),
            "the WireGuard key file has mode {mode:o}: others may read the private key; chmod 0400 it"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_made_0400_and_read_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/wgkey");
        let made = load_or_create(&path).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o400);
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            *made.to_base64(),
            "flannel's format: base64, no newline"
        );
        let again = load_or_create(&path).unwrap();
        assert_eq!(again.public_key(), made.public_key());
    }

    #[test]
    fn a_key_written_by_wg_genkey_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wgkey");
        fs::write(&path, "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=\n").unwrap();
        let key = load_or_create(&path).unwrap();
        assert_eq!(
            key.public_key().to_string(),
            "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="
        );
    }

    #[test]
    fn what_is_no_regular_file_or_too_long_is_refused_at_once_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let long = dir.path().join("long");
        fs::write(&long, "x".repeat(10_000)).unwrap();
        let cases = [
            (
                Path::new("/dev/zero"),
                "is a character device, not a regular file",
            ),
            (&fifo, "is a FIFO, not a regular file"),
            (dir.path(), "is a directory, not a regular file"),
            (&long, "is longer than 256 bytes"),
        ];
        for (path, want) in cases {
            let started = std::time::Instant::now();
            let err = load_or_create(path).unwrap_err().to_string();
            assert!(started.elapsed().as_secs() < 1, "{err}");
            let named = format!("the WireGuard key file {}: it {want}", path.display());
            assert!(err.contains(&named), "{err}");
        }
    }

    #[test]
    fn a_file_without_a_key_is_a_clear_error_that_shows_no_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wgkey");
        fs::write(&path, "c2VjcmV0").unwrap();
        let err = load_or_create(&path).unwrap_err().to_string();
        assert!(
            err.contains("holds no key") && !err.contains("c2VjcmV0"),
            "{err}"
        );
        assert!(!err.contains('\n'), "{err}");
    }
}
