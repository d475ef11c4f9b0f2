//! Talking to nftables: nft's JSON API (`nft -j`), the documents built with the `nftables`
//! crate's schema types. A document given to `nft -f` is one kernel transaction: all of it
//! applies or none of it does.
//!
//! The crate's own runner leaves nft's stderr uncaptured when applying, so its errors could not
//! say why nft failed; this one captures it, and [`explain`] turns a failure into one line.

use nftables::schema::{Nftables, Table};
use serde_json::Value;
use std::io::ErrorKind;
use std::process::Stdio;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

/// The nft binary, looked up on PATH as the crate does.
const NFT: &str = "nft";

/// Why an nft run failed, before it is explained to the operator.
#[derive(Debug)]
pub enum Failure {
    /// nft could not be started at all (`NotFound`: it is not installed).
    Spawn(std::io::Error),
    /// nft ran and refused; its stderr.
    Refused(String),
    /// nft answered with something that is not the JSON it documents.
    Output(String),
}

/// Applies a document (one transaction).
pub async fn apply(document: &Nftables<'_>) -> Result<(), Failure> {
    let json = serde_json::to_vec(document).expect("nftables documents serialize");
    run(&["-j", "-f", "-"], Some(&json)).await.map(drop)
}

/// The objects of the table `table` (itself, its chains and rules) as nft lists them, with
/// handles removed so two listings of the same rules compare equal; `None` when there is no
/// such table.
///
/// Kept as JSON values: the crate's parser does not read all of nft's output (a NAT statement's
/// single flag, `"flags": "fully-random"`, fails), and comparing needs no more than equality.
pub async fn list_table(table: &Table<'_>) -> Result<Option<Vec<Value>>, Failure> {
    let family = serde_json::to_value(table.family).expect("family serializes");
    let family = family.as_str().expect("family is a string");
    let tables = listing(&run(&["-j", "list", "tables", family], None).await?)?;
    let exists = tables.iter().any(|o| o["table"]["name"] == *table.name);
    if !exists {
        return Ok(None);
    }
    let objects = listing(&run(&["-j", "list", "table", family, &table.name], None).await?)?;
    Ok(Some(objects.into_iter().map(without_handle).collect()))
}

/// The ruleset objects of `nft -j list` output, without nft's metainfo.
fn listing(stdout: &[u8]) -> Result<Vec<Value>, Failure> {
    let mut document: Value =
        serde_json::from_slice(stdout).map_err(|e| Failure::Output(e.to_string()))?;
    let Some(Value::Array(objects)) = document.get_mut("nftables").map(Value::take) else {
        return Err(Failure::Output("no \"nftables\" array".into()));
    };
    Ok(objects
        .into_iter()
        .filter(|o| o.get("metainfo").is_none())
        .collect())
}

/// Handles are the kernel's numbering, new for every transaction; they are not the rules.
fn without_handle(mut object: Value) -> Value {
    if let Some(Value::Object(inner)) = object.as_object_mut().and_then(|o| o.values_mut().next()) {
        inner.remove("handle");
    }
    object
}

async fn run(args: &[&str], stdin: Option<&[u8]>) -> Result<Vec<u8>, Failure> {
    let mut child = Command::new(NFT)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(Failure::Spawn)?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input).await.map_err(Failure::Spawn)?;
    }
    let out = child.wait_with_output().await.map_err(Failure::Spawn)?;
    if !out.status.success() {
        return Err(Failure::Refused(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    Ok(out.stdout)
}

/// What to tell the operator when nft fails while `doing` something, in one line.
pub fn explain(failure: &Failure, doing: &str) -> String {
    match failure {
        Failure::Spawn(e) if e.kind() == ErrorKind::NotFound => format!(
            "cannot {doing}: the nft program is not installed (Debian: apt-get install nftables); \
             it is needed for --ip-masq and --iptables-forward-rules \
             (run with --iptables-forward-rules=false and without --ip-masq to do without)"
        ),
        Failure::Spawn(e) => format!("cannot {doing}: cannot run nft: {e}"),
        Failure::Refused(stderr) if stderr.contains("Operation not permitted") => {
            format!("cannot {doing}: nftables refused; twill needs root or CAP_NET_ADMIN")
        }
        Failure::Refused(stderr) => format!("cannot {doing}: nft said: {}", first_line(stderr)),
        Failure::Output(e) => format!("cannot {doing}: nft's JSON output is not understood: {e}"),
    }
}

/// [`explain`] for the first contact, before any rule is written: there, anything but a
/// permission problem means the kernel's nf_tables cannot be used.
pub fn explain_probe(failure: &Failure) -> String {
    match failure {
        Failure::Refused(stderr) if !stderr.contains("Operation not permitted") => format!(
            "cannot use nftables for --ip-masq and --iptables-forward-rules: the kernel's \
             nf_tables is not available (CONFIG_NF_TABLES; try `modprobe nf_tables`): nft said: {}",
            first_line(stderr)
        ),
        other => explain(other, "use nftables"),
    }
}

/// nft's first line says what went wrong; the rest echoes the input.
fn first_line(stderr: &str) -> &str {
    stderr
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("(nothing on stderr)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(stderr: &str) -> Failure {
        Failure::Refused(stderr.into())
    }

    #[test]
    fn a_kernel_without_nf_tables_is_named_with_nfts_words() {
        // What nft prints when the kernel cannot answer nf_tables requests: the errno depends
        // on what is missing (nfnetlink: EPROTONOSUPPORT; the nf_tables subsystem: EINVAL or
        // EOPNOTSUPP), so the first contact treats every refusal but EPERM as this.
        for stderr in [
            "netlink: Error: cache initialization failed: Protocol not supported\n",
            "Error: Could not process rule: Operation not supported\n",
            "netlink: Error: cache initialization failed: Invalid argument\n",
        ] {
            let line = explain_probe(&refused(stderr));
            assert!(line.contains("nf_tables is not available"), "{line}");
            assert!(line.contains("modprobe nf_tables"), "{line}");
            assert!(line.contains(stderr.trim()), "{line}");
            assert!(!line.contains('\n'), "{line:?}");
        }
    }

    #[test]
    fn missing_privilege_is_not_mistaken_for_a_missing_kernel_feature() {
        let stderr = "netlink: Error: cache initialization failed: Operation not permitted\n";
        for line in [
            explain_probe(&refused(stderr)),
            explain(&refused(stderr), "x"),
        ] {
            assert!(line.contains("CAP_NET_ADMIN"), "{line}");
            assert!(!line.contains("nf_tables is not available"), "{line}");
        }
    }

    #[test]
    fn a_missing_nft_program_says_what_to_install_and_how_to_do_without() {
        let missing = Failure::Spawn(std::io::Error::from(ErrorKind::NotFound));
        let line = explain_probe(&missing);
        assert!(line.contains("apt-get install nftables"), "{line}");
        assert!(line.contains("--iptables-forward-rules=false"), "{line}");
    }

    #[test]
    fn a_refused_transaction_reports_nfts_first_line_only() {
        let stderr =
            "\nError: Could not process rule: No such file or directory\n{\"nftables\": []}\n";
        let line = explain(&refused(stderr), "write twill's nftables table");
        assert_eq!(
            line,
            "cannot write twill's nftables table: nft said: Error: Could not process rule: No such file or directory"
        );
    }
}
