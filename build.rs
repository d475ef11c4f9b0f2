//! Puts the git commit twill is built from into `twill --version` (TWILL_GIT_COMMIT).
//!
//! From a tarball without .git (or one unpacked inside some other repository) it is "unknown",
//! unless the builder sets TWILL_GIT_COMMIT itself.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=TWILL_GIT_COMMIT");
    let commit = std::env::var("TWILL_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=TWILL_GIT_COMMIT={commit}");
}

/// The commit of this crate's own repository, watching the files that change with it.
fn git_commit() -> Option<String> {
    let here = std::env::var("CARGO_MANIFEST_DIR").ok()?;
    let top = git(&here, &["rev-parse", "--show-toplevel"])?;
    if Path::new(&top).canonicalize().ok()? != Path::new(&here).canonicalize().ok()? {
        return None;
    }
    // HEAD moves on checkout; the branch's ref on commit (loose, or packed by gc).
    for file in ["HEAD", "packed-refs"] {
        watch(&here, file);
    }
    if let Some(branch) = git(&here, &["symbolic-ref", "-q", "HEAD"]) {
        watch(&here, &branch);
    }
    git(&here, &["rev-parse", "--short=12", "HEAD"])
}

fn watch(dir: &str, git_file: &str) {
    if let Some(path) = git(dir, &["rev-parse", "--git-path", git_file]) {
        println!(
            "cargo:rerun-if-changed={}",
            Path::new(dir).join(path).display()
        );
    }
}

fn git(dir: &str, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    out.status.success().then(|| text.trim().to_string())
}
