//! Container images as archives: an OCI image layout in a tar (as `scripts/oci-image` writes
//! them), imported into each node's containerd. The name is the archive's own, so a test that
//! points a manifest at an image takes it from here.

use crate::proc::run;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where containerd reads the image's name from.
const NAME_ANNOTATION: &str = "io.containerd.image.name";

/// An image archive and the reference its index.json gives it (e.g. `localhost/twill:0.1.0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub archive: PathBuf,
    pub name: String,
}

impl Image {
    /// The image in `archive`, named by its index.json's `io.containerd.image.name`.
    pub fn from_archive(archive: &Path) -> Result<Image> {
        let index = run(Command::new("tar")
            .arg("-xOf")
            .arg(archive)
            .arg("index.json"))
        .with_context(|| format!("{} is not an OCI image archive", archive.display()))?;
        let index: serde_json::Value = serde_json::from_str(&index)
            .with_context(|| format!("{}: index.json is not JSON", archive.display()))?;
        let name = index["manifests"][0]["annotations"][NAME_ANNOTATION]
            .as_str()
            .with_context(|| {
                format!(
                    "{}: index.json names no image ({NAME_ANNOTATION})",
                    archive.display()
                )
            })?;
        Ok(Image {
            archive: archive.into(),
            name: name.into(),
        })
    }

    /// One of the images `scripts/kube-parts` makes: `pause`, `busybox` (a shell and its
    /// applets, entrypoint /bin/sh), `flannel` (flannel's image around a real flanneld), or
    /// `flannel-cni-plugin`.
    pub fn part(name: &str) -> Result<Image> {
        Self::from_archive(&crate::kube_part(&format!("images/{name}.tar"))?)
    }
}
