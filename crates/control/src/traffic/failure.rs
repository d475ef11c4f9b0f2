//! Why writing or reading flannel's rules failed (nf_tables over netlink, the iptables
//! programs, the legacy tables), and what to tell the operator about it in one line.

use std::io;
use std::time::Duration;

/// What an operator does when the host's iptables cannot be used.
const IPTABLES_FIX: &str = "install iptables (Debian: apt install iptables), or set \
                            \"EnableNFTables\": true in the network config to have flannel's \
                            nftables tables instead";

/// Why a request failed, before it is explained to the operator.
#[derive(Debug)]
pub enum Failure {
    /// The netfilter netlink socket cannot be opened (EPROTONOSUPPORT: no nfnetlink).
    Socket(io::Error),
    /// The kernel refused `what` (an operation of a transaction, or a read) with this errno.
    Refused { what: String, error: io::Error },
    /// Sending or receiving on the socket failed (e.g. no answer within the timeout).
    Io(io::Error),
    /// The kernel's answer is not what nf_tables documents.
    Garbled(String),
    /// Neither backend's iptables programs are installed; `wanted` names the nf_tables ones.
    NoIptables { wanted: Vec<String> },
    /// A program could not be started (not installed, when `error` is NotFound).
    Program { program: String, error: io::Error },
    /// A program ran and failed; `stderr` is what it said, on one line.
    Failed {
        program: String,
        status: String,
        stderr: String,
    },
    /// A program did not finish in time (and was killed).
    TimedOut { program: String, after: Duration },
    /// Something that cannot happen unless twill is wrong about the kernel or a program.
    Unexpected(String),
}

impl Failure {
    fn errno(&self) -> Option<i32> {
        match self {
            Failure::Socket(e) | Failure::Io(e) | Failure::Refused { error: e, .. } => {
                e.raw_os_error()
            }
            Failure::Garbled(_)
            | Failure::NoIptables { .. }
            | Failure::Failed { .. }
            | Failure::TimedOut { .. }
            | Failure::Unexpected(_) => None,
            Failure::Program { error, .. } => error.raw_os_error(),
        }
    }

    /// Refused for want of privilege by the kernel (a program says so in its own words).
    fn is_permission(&self) -> bool {
        let kernel = !matches!(self, Failure::Program { .. });
        kernel && matches!(self.errno(), Some(libc::EPERM | libc::EACCES))
    }
}

/// What to tell the operator when nf_tables fails while `doing` something, in one line.
pub fn explain(failure: &Failure, doing: &str) -> String {
    if failure.is_permission() {
        return format!(
            "cannot {doing}: the kernel refused for want of privilege; twill needs root or \
             CAP_NET_ADMIN"
        );
    }
    match failure {
        Failure::Socket(e) => {
            format!("cannot {doing}: cannot open a netfilter netlink socket: {e}")
        }
        Failure::Refused { what, error } => {
            format!(
                "cannot {doing}: the kernel refused {what}: {error}{}",
                hint(failure)
            )
        }
        Failure::Io(e) => format!("cannot {doing}: {e}"),
        Failure::Garbled(e) => {
            format!("cannot {doing}: the kernel's answer is not understood: {e}")
        }
        Failure::NoIptables { wanted } => format!(
            "cannot {doing}: flannel's iptables mode (the network config does not set \
             \"EnableNFTables\": true) needs iptables 1.8, and neither {} nor its -legacy- \
             form is on PATH; {IPTABLES_FIX}",
            wanted.join(" nor ")
        ),
        Failure::Program { program, error } if error.kind() == io::ErrorKind::NotFound => {
            format!("cannot {doing}: {program} is not on PATH; {IPTABLES_FIX}")
        }
        Failure::Program { program, error } => {
            format!("cannot {doing}: cannot run {program}: {error}")
        }
        Failure::Failed {
            program,
            status,
            stderr,
        } => format!("cannot {doing}: {program} failed ({status}): {stderr}"),
        Failure::TimedOut { program, after } => {
            format!("cannot {doing}: {program} did not finish within {after:?}")
        }
        Failure::Unexpected(e) => format!("cannot {doing}: {e}"),
    }
}

/// A missing expression or chain type is named ENOENT (its module could not be loaded) or
/// EOPNOTSUPP; the likely modules are those of NAT.
fn hint(failure: &Failure) -> &'static str {
    match failure.errno() {
        Some(libc::ENOENT | libc::EOPNOTSUPP) => {
            " (is the kernel's nftables NAT support there: nft_chain_nat, nft_masq?)"
        }
        _ => "",
    }
}

/// [`explain`] for the first contact with nf_tables, before any rule is written (for `what`:
/// nftables mode's tables, or iptables-nft's generation): there, anything but a permission
/// problem means the kernel's nf_tables cannot be used; `fix` says what to do instead.
pub fn explain_probe(failure: &Failure, what: &str, fix: &str) -> String {
    let error = match failure {
        _ if failure.is_permission() => return explain(failure, what),
        Failure::Socket(e) | Failure::Io(e) | Failure::Refused { error: e, .. } => e.to_string(),
        other => return explain(other, what),
    };
    format!(
        "cannot {what}: the kernel's nf_tables is not available (CONFIG_NF_TABLES; try \
         `modprobe nf_tables`): {error}; {fix}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno(code: i32) -> io::Error {
        io::Error::from_raw_os_error(code)
    }

    fn refused(code: i32) -> Failure {
        Failure::Refused {
            what: "get table ip flannel-ipv4".into(),
            error: errno(code),
        }
    }

    const WHAT: &str = "write flannel's nftables tables (\"EnableNFTables\": true)";
    const FIX: &str = "set \"EnableNFTables\" to false to have iptables chains";

    #[test]
    fn a_kernel_without_nf_tables_is_named() {
        // What the kernel answers when it cannot serve nf_tables: no nfnetlink at all refuses
        // the socket (EPROTONOSUPPORT); nfnetlink without the nf_tables subsystem refuses the
        // request (EINVAL, or EOPNOTSUPP for a batch). So the first contact treats every
        // refusal but EPERM as this.
        for failure in [
            Failure::Socket(errno(libc::EPROTONOSUPPORT)),
            refused(libc::EINVAL),
            refused(libc::EOPNOTSUPP),
        ] {
            let line = explain_probe(&failure, WHAT, FIX);
            assert!(line.contains("nf_tables is not available"), "{line}");
            assert!(line.contains("modprobe nf_tables"), "{line}");
            assert!(line.contains("EnableNFTables\" to false"), "{line}");
            assert!(!line.contains('\n'), "{line:?}");
        }
        let line = explain_probe(&refused(libc::EINVAL), WHAT, FIX);
        assert!(line.contains(&errno(libc::EINVAL).to_string()), "{line}");
    }

    #[test]
    fn missing_privilege_is_not_mistaken_for_a_missing_kernel_feature() {
        for line in [
            explain_probe(&refused(libc::EPERM), WHAT, FIX),
            explain(&refused(libc::EPERM), "x"),
            explain(&Failure::Io(errno(libc::EPERM)), "x"),
        ] {
            assert!(line.contains("CAP_NET_ADMIN"), "{line}");
            assert!(!line.contains("nf_tables is not available"), "{line}");
        }
    }

    #[test]
    fn a_refused_transaction_names_the_operation() {
        let failure = Failure::Refused {
            what: "add rule 5 of chain ip flannel-ipv4 postrtg (ip saddr 10.5.0.0/16 \
                   masquerade fully-random)"
                .into(),
            error: errno(libc::ENOENT),
        };
        let line = explain(&failure, "write flannel's nftables tables");
        assert!(
            line.starts_with(
                "cannot write flannel's nftables tables: the kernel refused add rule 5 of chain \
                 ip flannel-ipv4 postrtg (ip saddr 10.5.0.0/16 masquerade fully-random): "
            ),
            "{line}"
        );
        assert!(line.contains("nft_masq"), "{line}");
    }

    #[test]
    fn missing_iptables_says_what_to_install_and_which_field_to_set() {
        let none = Failure::NoIptables {
            wanted: vec!["iptables-nft-restore".into()],
        };
        let not_found = Failure::Program {
            program: "iptables-legacy-save".into(),
            error: errno(libc::ENOENT),
        };
        for line in [
            explain(&none, "write flannel's iptables chains"),
            explain(&not_found, "x"),
        ] {
            assert!(line.contains("apt install iptables"), "{line}");
            assert!(line.contains("\"EnableNFTables\": true"), "{line}");
            assert!(!line.contains('\n'), "{line:?}");
        }
        assert!(explain(&none, "x").contains("iptables-nft-restore"));
    }

    #[test]
    fn a_failed_program_is_quoted() {
        let failed = Failure::Failed {
            program: "iptables-nft-restore".into(),
            status: "exit status: 1".into(),
            stderr: "iptables-nft-restore: line 3 failed".into(),
        };
        assert_eq!(
            explain(&failed, "repair flannel's rules"),
            "cannot repair flannel's rules: iptables-nft-restore failed (exit status: 1): \
             iptables-nft-restore: line 3 failed"
        );
    }
}
