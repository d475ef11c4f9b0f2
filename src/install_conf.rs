//! `install-conf SRC DEST`: flannel's image's installer for the CNI config, which
//! kube-flannel.yml's init container runs to copy `cni-conf.json` to
//! `/etc/cni/net.d/10-flannel.conflist`. The copy is atomic, as flannel's is: written to a
//! temporary file beside DEST, with SRC's permissions, then renamed over it, so the container
//! runtime never reads half a config.

use anyhow::Context;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::Path;

/// A CNI config is a few hundred bytes; anything near this is not one.
const MAX_SIZE: u64 = 1 << 20;

/// `args` with the program's name first; the exit code.
pub fn main(args: &[OsString]) -> i32 {
    let [_, src, dest] = args else {
        let program = args
            .first()
            .map_or("install-conf".into(), |p| p.to_string_lossy());
        eprintln!("usage: {program} <src> <dest>");
        return 1;
    };
    match install(Path::new(src), Path::new(dest)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!(
                "install-conf: cannot install {}: {e:#}",
                src.to_string_lossy()
            );
            1
        }
    }
}

fn install(src: &Path, dest: &Path) -> anyhow::Result<()> {
    let mut file =
        std::fs::File::open(src).with_context(|| format!("opening {}", src.display()))?;
    let meta = file.metadata()?;
    anyhow::ensure!(meta.is_file(), "{} is not a regular file", src.display());
    let mut content = Vec::new();
    (&mut file).take(MAX_SIZE + 1).read_to_end(&mut content)?;
    anyhow::ensure!(
        content.len() as u64 <= MAX_SIZE,
        "{} is larger than {MAX_SIZE} bytes: not a CNI config",
        src.display()
    );
    let dir = match dest.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut temp = tempfile::Builder::new()
        .prefix(".install-conf.")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    temp.write_all(&content)?;
    temp.as_file().sync_all()?;
    temp.as_file().set_permissions(meta.permissions())?;
    temp.persist(dest)
        .with_context(|| format!("replacing {}", dest.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_config_is_copied_with_its_mode_and_nothing_else_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("cni-conf.json");
        std::fs::write(&src, b"{\"name\":\"cbr0\"}").unwrap();
        std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o640)).unwrap();
        let net_d = dir.path().join("net.d");
        std::fs::create_dir(&net_d).unwrap();
        let dest = net_d.join("10-flannel.conflist");
        std::fs::write(&dest, b"old").unwrap();
        let args: Vec<OsString> = ["install-conf".as_ref(), src.as_os_str(), dest.as_os_str()]
            .iter()
            .map(|a| a.into())
            .collect();
        assert_eq!(main(&args), 0);
        assert_eq!(std::fs::read(&dest).unwrap(), b"{\"name\":\"cbr0\"}");
        let mode = std::fs::metadata(&dest).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640);
        let left: Vec<_> = std::fs::read_dir(&net_d).unwrap().collect();
        assert_eq!(left.len(), 1, "{left:?}");
    }

    #[test]
    fn bad_arguments_and_sources_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out");
        assert_eq!(main(&["install-conf".into()]), 1);
        let err = install(Path::new("/nonexistent"), &dest).unwrap_err();
        assert!(format!("{err:#}").contains("/nonexistent"), "{err:#}");
        let err = install(dir.path(), &dest).unwrap_err();
        assert!(format!("{err:#}").contains("not a regular file"), "{err:#}");
        let err = install(Path::new("/dev/zero"), &dest).unwrap_err();
        assert!(format!("{err:#}").contains("not a regular file"), "{err:#}");
        assert!(!dest.exists());
    }
}
