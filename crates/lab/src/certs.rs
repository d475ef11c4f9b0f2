//! Key material for the lab's servers (the kube-apiserver, a TLS etcd) and their clients, made
//! with the `openssl` CLI (no Rust X.509 writer is a dependency, and openssl is on every test
//! machine through scripts/setup).

use crate::proc::run;
use anyhow::{Context, Result};
use std::io::Read;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) const CA_CERT: &str = "ca.crt";
pub(crate) const CA_KEY: &str = "ca.key";
pub(crate) const SERVER_CERT: &str = "server.crt";
pub(crate) const SERVER_KEY: &str = "server.key";
/// Signs and verifies service-account tokens.
pub(crate) const SA_KEY: &str = "sa.key";
/// The API server's client certificate towards kubelets (logs, exec), in `system:masters`.
pub(crate) const KUBELET_CLIENT: &str = "kubelet-client";
/// The `kubernetes` Service's address in the service range (10.96.0.0/16): in-cluster clients
/// check the serving certificate against it.
const SERVICE_IP: &str = "10.96.0.1";
/// A fresh P-256 key, unencrypted: much faster to make than RSA.
const EC_KEY: &str = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
/// Outlives any test, and a skewed clock between runs does not matter: everything is fresh.
const DAYS: &str = "2";

/// Writes a CA, a serving certificate it signs (for `ip`, 127.0.0.1, localhost and the in-cluster
/// name and address), the client certificate the server shows kubelets, and an RSA
/// service-account key into `dir`.
pub(crate) fn write(dir: &Path, ip: Ipv4Addr) -> Result<()> {
    std::fs::write(
        dir.join("server.ext"),
        format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth\n\
             subjectAltName=IP:{ip},IP:127.0.0.1,IP:{SERVICE_IP},DNS:localhost,\
             DNS:kubernetes.default.svc\n"
        ),
    )?;
    write_ca(dir)?;
    sign(dir, "server", "/CN=kube-apiserver", "server.ext")?;
    write_client(
        dir,
        KUBELET_CLIENT,
        "/O=system:masters/CN=kube-apiserver-kubelet-client",
    )?;
    openssl(
        dir,
        &format!("genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out {SA_KEY}"),
    )
}

/// A CA's certificate, and a certificate it signed with its key: what one end of a TLS
/// connection that checks both ends shows.
#[derive(Debug, Clone)]
pub struct Identity {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Writes a fresh CA into `dir` (made if missing) and, signed by it, one certificate for `ip`
/// that serves and is a client: what a TLS etcd and the clients it trusts present.
pub fn write_identity(dir: &Path, ip: Ipv4Addr) -> Result<Identity> {
    std::fs::create_dir_all(dir)?;
    write_ca(dir)?;
    std::fs::write(
        dir.join("identity.ext"),
        format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=IP:{ip}\n"
        ),
    )?;
    sign(dir, "identity", &format!("/CN={ip}"), "identity.ext")?;
    Ok(Identity {
        ca: dir.join(CA_CERT),
        cert: dir.join("identity.crt"),
        key: dir.join("identity.key"),
    })
}

/// A CA's key and self-signed certificate in `dir`.
fn write_ca(dir: &Path) -> Result<()> {
    openssl(
        dir,
        &format!(
            "req -x509 -days {DAYS} {EC_KEY} -subj /CN=twill-lab-ca -keyout {CA_KEY} -out {CA_CERT} \
             -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign"
        ),
    )
}

/// Writes `NAME.crt` and `NAME.key` into `dir`: a client certificate for `subject` (e.g.
/// `/O=system:nodes/CN=system:node:node-1`, the user and group the API server sees) signed by the
/// CA in `dir`.
pub(crate) fn write_client(dir: &Path, name: &str, subject: &str) -> Result<()> {
    let ext = format!("{name}.ext");
    std::fs::write(
        dir.join(&ext),
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
         extendedKeyUsage=clientAuth\n",
    )?;
    sign(dir, name, subject, &ext)
}

/// `NAME.key` (P-256) and `NAME.crt` for `subject` signed by the CA in `dir` with the
/// extensions in file `ext`.
fn sign(dir: &Path, name: &str, subject: &str, ext: &str) -> Result<()> {
    openssl(
        dir,
        &format!("req {EC_KEY} -subj {subject} -keyout {name}.key -out {name}.csr"),
    )?;
    openssl(
        dir,
        &format!(
            "x509 -req -in {name}.csr -CA {CA_CERT} -CAkey {CA_KEY} -CAcreateserial -days {DAYS} \
             -extfile {ext} -out {name}.crt"
        ),
    )
}

/// `2 * bytes` hex digits from the kernel's CSPRNG, for tokens.
pub(crate) fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Runs `openssl` in `dir` with `args`, split at spaces: every file is named relative to `dir`,
/// and no argument holds a space.
fn openssl(dir: &Path, args: &str) -> Result<()> {
    let mut cmd = Command::new("openssl");
    cmd.current_dir(dir).args(args.split_whitespace());
    run(&mut cmd)
        .context("the kube lab makes its certificates with the openssl CLI (scripts/setup)")?;
    Ok(())
}
