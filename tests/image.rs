//! scripts/image: the image kube-flannel.yml expects, laid out around the twill binary, as an
//! OCI archive with no registry and no Docker (scripts/oci-image). Checked from the archive's
//! bytes: its index names the image for containerd, its docker-archive manifest for docker load,
//! every blob is what its digest says, the entrypoint is /opt/bin/flanneld, and inside the layer
//! /opt/bin/flanneld is the twill binary (debug info stripped), /opt/bin/install-conf and /usr/bin/twill links to it,
//! and iptables (nft and legacy), nft and a shell run from the image's own files. containerd
//! importing and running images this writer makes is what tests/cluster.rs does.

mod common;

use anyhow::{ensure, Context, Result};
use common::kube_flannel::{twill_image, TWILL_IMAGE};
use common::TWILL;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::process::Command;

#[test]
fn twill_image_holds_flanneld_install_conf_and_the_rules_tools() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let image = twill_image(dir.path())?;
    ensure!(
        image.name == TWILL_IMAGE,
        "the archive names {}",
        image.name
    );
    let archive = dir.path().join("archive");
    untar(&image.archive, &archive)?;

    let index = read_json(&archive.join("index.json"))?;
    let entry = &index["manifests"][0];
    ensure!(
        entry["annotations"]
            == json!({"io.containerd.image.name": TWILL_IMAGE, "org.opencontainers.image.ref.name": "test"}),
        "index.json: {index}"
    );
    ensure!(read_json(&archive.join("oci-layout"))? == json!({"imageLayoutVersion": "1.0.0"}));
    let manifest = blob(&archive, &entry["digest"])?;
    let config = blob(&archive, &manifest["config"]["digest"])?;
    let layers = manifest["layers"].as_array().context("no layers")?;
    ensure!(layers.len() == 1, "{} layers", layers.len());
    let layer = &layers[0];
    ensure!(layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar");
    ensure!(config["rootfs"]["diff_ids"] == json!([layer["digest"]]));
    ensure!(
        config["config"]["Entrypoint"] == json!(["/opt/bin/flanneld"]),
        "config: {config}"
    );
    let docker = read_json(&archive.join("manifest.json"))?;
    let path = |digest: &Value| format!("blobs/sha256/{}", hex_of(digest));
    ensure!(
        docker
            == json!([{
                "Config": path(&manifest["config"]["digest"]),
                "RepoTags": [TWILL_IMAGE],
                "Layers": [path(&layer["digest"])],
            }]),
        "manifest.json: {docker}"
    );

    let layer_file = archive.join(path(&layer["digest"]));
    ensure!(
        sha256(&layer_file)? == hex_of(&layer["digest"]),
        "the layer does not hash to its name"
    );
    let root = dir.path().join("root");
    untar(&layer_file, &root)?;
    // The same build, its debug info stripped.
    let flanneld = root.join("opt/bin/flanneld");
    ensure!(
        build_id(&flanneld)? == build_id(Path::new(TWILL))?,
        "/opt/bin/flanneld is not the twill binary"
    );
    ensure!(
        !run(Command::new("readelf").arg("-S").arg(&flanneld))?.contains(".debug_info"),
        "/opt/bin/flanneld still has its debug info"
    );
    let link = std::fs::read_link(root.join("opt/bin/install-conf"))?;
    ensure!(
        link == Path::new("flanneld"),
        "install-conf links to {}",
        link.display()
    );
    // deploy/kubernetes/twill.yml runs /usr/bin/twill.
    let link = std::fs::read_link(root.join("usr/bin/twill"))?;
    ensure!(
        link == Path::new("/opt/bin/flanneld"),
        "twill links to {}",
        link.display()
    );
    for (args, says) in [
        (&["/opt/bin/flanneld", "--version"][..], "0.1"),
        (&["/usr/sbin/iptables-nft", "--version"], "nf_tables"),
        (&["/usr/sbin/iptables-legacy", "--version"], "legacy"),
        (
            &["/usr/sbin/ip6tables-nft-restore", "--version"],
            "nf_tables",
        ),
        (&["/usr/sbin/nft", "--version"], "nftables"),
        (&["/bin/sh", "-c", "echo shell"], "shell"),
    ] {
        let out = run(Command::new("chroot").arg(&root).args(args))?;
        ensure!(out.contains(says), "{args:?} in the image said {out}");
    }
    Ok(())
}

fn untar(archive: &Path, into: &Path) -> Result<()> {
    std::fs::create_dir_all(into)?;
    run(Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(into))?;
    Ok(())
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))
}

/// The JSON blob `digest` names, after checking its bytes hash to that digest.
fn blob(archive: &Path, digest: &Value) -> Result<Value> {
    let path = archive.join("blobs/sha256").join(hex_of(digest));
    ensure!(
        sha256(&path)? == hex_of(digest),
        "{} does not hash to its name",
        path.display()
    );
    read_json(&path)
}

fn hex_of(digest: &Value) -> String {
    let digest = digest.as_str().unwrap_or_default();
    digest.trim_start_matches("sha256:").to_string()
}

/// The GNU build id the linker wrote into an ELF file.
fn build_id(path: &Path) -> Result<String> {
    let notes = run(Command::new("readelf").arg("-n").arg(path))?;
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "));
    id.map(str::to_string)
        .with_context(|| format!("{}: no build id", path.display()))
}

fn sha256(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| path.display().to_string())?;
    Ok(hex::encode(Sha256::digest(bytes)))
}

/// stdout and stderr together: `--version` goes to either.
fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("{cmd:?}"))?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success(),
        "{cmd:?} failed ({}): {text}",
        out.status
    );
    Ok(text)
}
