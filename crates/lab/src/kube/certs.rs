//! Key material for one server, made with the `openssl` CLI (no Rust X.509 writer is a
//! dependency, and openssl is on every test machine through scripts/setup).

use crate::proc::run;
use anyhow::{Context, Result};
use std::io::Read;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

pub(super) const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
pub(super) const SERVER_CERT: &str = "server.crt";
pub(super) const SERVER_KEY: &str = "server.key";
/// Signs and verifies service-account tokens.
pub(super) const SA_KEY: &str = "sa.key";
/// Outlives any test, and a skewed clock between runs does not matter: everything is fresh.
const DAYS: &str = "2";

/// Writes a CA, a serving certificate it signs (for `ip`, 127.0.0.1, localhost and the in-cluster
/// name) and an RSA service-account key into `dir`. P-256 keys for TLS: much faster to generate.
pub(super) fn write(dir: &Path, ip: Ipv4Addr) -> Result<()> {
    std::fs::write(
        dir.join("server.ext"),
        format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth\n\
             subjectAltName=IP:{ip},IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n"
        ),
    )?;
    let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    openssl(
        dir,
        &format!(
            "req -x509 -days {DAYS} {ec} -subj /CN=twill-lab-ca -keyout {CA_KEY} -out {CA_CERT} \
             -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign"
        ),
    )?;
    let csr = "server.csr";
    openssl(
        dir,
        &format!("req {ec} -subj /CN=kube-apiserver -keyout {SERVER_KEY} -out {csr}"),
    )?;
    openssl(
        dir,
        &format!(
            "x509 -req -in {csr} -CA {CA_CERT} -CAkey {CA_KEY} -CAcreateserial -days {DAYS} \
             -extfile server.ext -out {SERVER_CERT}"
        ),
    )?;
    openssl(
        dir,
        &format!("genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out {SA_KEY}"),
    )
}

/// `2 * bytes` hex digits from the kernel's CSPRNG, for tokens.
pub(super) fn random_hex(bytes: usize) -> Result<String> {
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
