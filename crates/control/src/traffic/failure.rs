//! Why talking to nf_tables failed, and what to tell the operator about it in one line.

use std::io;

/// Why an nf_tables request failed, before it is explained to the operator.
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
}

impl Failure {
    fn errno(&self) -> Option<i32> {
        match self {
            Failure::Socket(e) | Failure::Io(e) | Failure::Refused { error: e, .. } => {
                e.raw_os_error()
            }
            Failure::Garbled(_) => None,
        }
    }

    fn is_permission(&self) -> bool {
        matches!(self.errno(), Some(libc::EPERM | libc::EACCES))
    }
}

/// What to tell the operator when nf_tables fails while `doing` something, in one line.
pub fn explain(failure: &Failure, doing: &str) -> String {
    if failure.is_permission() {
        return format!("cannot {doing}: nftables refused; twill needs root or CAP_NET_ADMIN");
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
        Failure::Io(e) => format!("cannot {doing}: netfilter netlink: {e}"),
        Failure::Garbled(e) => {
            format!("cannot {doing}: the kernel's answer is not understood: {e}")
        }
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

/// [`explain`] for the first contact, before any rule is written: there, anything but a
/// permission problem means the kernel's nf_tables cannot be used.
pub fn explain_probe(failure: &Failure) -> String {
    let error = match failure {
        _ if failure.is_permission() => return explain(failure, "use nftables"),
        Failure::Socket(e) | Failure::Io(e) | Failure::Refused { error: e, .. } => e.to_string(),
        Failure::Garbled(e) => e.clone(),
    };
    format!(
        "cannot use nftables for --ip-masq and --iptables-forward-rules: the kernel's nf_tables \
         is not available (CONFIG_NF_TABLES; try `modprobe nf_tables`): {error}; \
         run with --iptables-forward-rules=false and without --ip-masq to do without"
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
            what: "get table ip twill-ipv4".into(),
            error: errno(code),
        }
    }

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
            let line = explain_probe(&failure);
            assert!(line.contains("nf_tables is not available"), "{line}");
            assert!(line.contains("modprobe nf_tables"), "{line}");
            assert!(line.contains("--iptables-forward-rules=false"), "{line}");
            assert!(!line.contains("nft program"), "{line}");
            assert!(!line.contains('\n'), "{line:?}");
        }
        let line = explain_probe(&refused(libc::EINVAL));
        assert!(line.contains(&errno(libc::EINVAL).to_string()), "{line}");
    }

    #[test]
    fn missing_privilege_is_not_mistaken_for_a_missing_kernel_feature() {
        for line in [
            explain_probe(&refused(libc::EPERM)),
            explain(&refused(libc::EPERM), "x"),
        ] {
            assert!(line.contains("CAP_NET_ADMIN"), "{line}");
            assert!(!line.contains("nf_tables is not available"), "{line}");
        }
    }

    #[test]
    fn a_refused_transaction_names_the_operation() {
        let failure = Failure::Refused {
            what: "add rule 5 of chain postrtg (ip saddr 10.5.0.0/16 masquerade fully-random)"
                .into(),
            error: errno(libc::ENOENT),
        };
        let line = explain(&failure, "write twill's nftables table");
        assert!(
            line.starts_with(
                "cannot write twill's nftables table: the kernel refused add rule 5 of chain \
                 postrtg (ip saddr 10.5.0.0/16 masquerade fully-random): "
            ),
            "{line}"
        );
        assert!(line.contains("nft_masq"), "{line}");
    }
}
