//! The host's iptables programs: which backend to use (nf_tables or legacy), and running
//! `iptables-save` and `iptables-restore` of that backend, bounded in time.
//!
//! iptables 1.8 comes as two programs per job, `iptables-nft-*` and `iptables-legacy-*`
//! (Debian's `iptables` package has both); they write to different kernel subsystems, and a
//! rule must go where the host's other rules are for FORWARD's policy and the order of NAT
//! rules to mean what flanneld's mean. The choice is kubernetes-sigs/iptables-wrappers': the
//! backend holding kubelet's hint chains, else the one holding more rules, else nf_tables.

use super::super::failure::Failure;
use super::super::ruleset::Family;
use super::saved::Saved;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

/// Long enough for `iptables-restore -w` to wait out another holder of the xtables lock.
const RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// One of iptables' two backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// iptables-nft: iptables' rules as nf_tables objects.
    Nft,
    /// iptables-legacy: the kernel's x_tables.
    Legacy,
}

impl Backend {
    pub const ALL: [Backend; 2] = [Backend::Nft, Backend::Legacy];

    /// `iptables-nft`, `iptables-legacy`: the name `twill status` shows.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Nft => "iptables-nft",
            Backend::Legacy => "iptables-legacy",
        }
    }

    /// This backend's program for `job` (`save`, `restore`) in `family`:
    /// `iptables-nft-restore`, `ip6tables-legacy-save`.
    pub fn program(self, family: Family, job: &str) -> String {
        let (iptables, backend) = (command(family), self.name().trim_start_matches("iptables-"));
        format!("{iptables}-{backend}-{job}")
    }

    /// Whether this backend's save and restore programs for `families` are all on PATH.
    fn installed(self, families: &[Family]) -> bool {
        let jobs = ["save", "restore"];
        families
            .iter()
            .all(|&f| jobs.iter().all(|job| on_path(&self.program(f, job))))
    }
}

/// `iptables`, `ip6tables`.
pub fn command(family: Family) -> &'static str {
    match family {
        Family::Ipv4 => "iptables",
        Family::Ipv6 => "ip6tables",
    }
}

/// Whether an executable of that name is in a directory of PATH.
fn on_path(name: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| {
        let file = dir.join(name);
        let mode = std::fs::metadata(&file).map(|m| m.permissions().mode());
        mode.is_ok_and(|m| m & 0o111 != 0 && Path::new(&file).is_file())
    })
}

/// The backend flannel's chains go to, for a network of `families`: the only one installed,
/// or, with both, the host's (see the module's comment). Fails when neither is installed.
pub async fn choose(families: &[Family]) -> Result<Backend, Failure> {
    let installed: Vec<Backend> = Backend::ALL
        .into_iter()
        .filter(|b| b.installed(families))
        .collect();
    match installed[..] {
        [] => Err(Failure::NoIptables {
            wanted: families
                .iter()
                .map(|&f| Backend::Nft.program(f, "restore"))
                .collect(),
        }),
        [only] => Ok(only),
        _ => {
            let nft = everything(Backend::Nft, families).await;
            let legacy = everything(Backend::Legacy, families).await;
            Ok(pick(nft.as_deref(), legacy.as_deref()))
        }
    }
}

/// kubelet's hint first (nf_tables before legacy, as iptables-wrappers looks), then which holds
/// more rules; nf_tables when neither holds any, as Debian's `iptables` defaults to. A backend
/// whose save program fails (`None`: the kernel lacks its subsystem) is not chosen over one
/// that works.
fn pick(nft: Option<&[Saved]>, legacy: Option<&[Saved]>) -> Backend {
    let hinted = |saved: Option<&[Saved]>| {
        saved
            .unwrap_or_default()
            .iter()
            .any(Saved::has_kubelet_hint)
    };
    let rules = |saved: Option<&[Saved]>| {
        let saved = saved.unwrap_or_default();
        saved.iter().map(Saved::rule_count).sum::<usize>()
    };
    if nft.is_none() && legacy.is_some() {
        Backend::Legacy
    } else if hinted(nft) {
        Backend::Nft
    } else if hinted(legacy) || rules(legacy) > rules(nft) {
        Backend::Legacy
    } else {
        Backend::Nft
    }
}

/// What `backend` holds in both families, as its save programs print it; `None` when one for
/// `families` fails (a kernel without that subsystem). The other family's is read where it can
/// be: kubelet's hint may be there.
async fn everything(backend: Backend, families: &[Family]) -> Option<Vec<Saved>> {
    let mut saved = Vec::new();
    for family in Family::ALL {
        // Without `-t`: iptables-legacy-save then lists only the tables that exist, and
        // creates none (`-t nat` would make the kernel instantiate it).
        match save(backend, family).await {
            Ok(found) => saved.push(found),
            Err(_) if families.contains(&family) => return None,
            Err(_) => {}
        }
    }
    Some(saved)
}

/// `iptables-save` of `backend` in `family`: every table there is.
pub async fn save(backend: Backend, family: Family) -> Result<Saved, Failure> {
    let text = run(&backend.program(family, "save"), &[], None).await?;
    Ok(Saved::parse(&text))
}

/// `iptables-restore --noflush -w` of `backend` in `family`, given `input`.
pub async fn restore(backend: Backend, family: Family, input: &str) -> Result<(), Failure> {
    let program = backend.program(family, "restore");
    run(&program, &["--noflush", "-w"], Some(input))
        .await
        .map(drop)
}

/// Runs `program` with `args` and `stdin`, for at most [`RUN_TIMEOUT`]; its standard output.
async fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, Failure> {
    let started = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = started.map_err(|error| Failure::Program {
        program: program.into(),
        error,
    })?;
    let input = stdin.unwrap_or_default().as_bytes().to_vec();
    let pipe = child.stdin.take();
    let feed = async move {
        // A program that exits early closes the pipe; its status says why. Dropping the pipe
        // at the end is the input's end.
        if let Some(mut pipe) = pipe {
            let _ = pipe.write_all(&input).await;
        }
    };
    let finished = async { tokio::join!(feed, child.wait_with_output()).1 };
    let output = tokio::time::timeout(RUN_TIMEOUT, finished)
        .await
        .map_err(|_| Failure::TimedOut {
            program: program.into(),
            after: RUN_TIMEOUT,
        })?
        .map_err(|error| Failure::Program {
            program: program.into(),
            error,
        })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(Failure::Failed {
            program: program.into(),
            status: output.status.to_string(),
            stderr: stderr.split_whitespace().collect::<Vec<_>>().join(" "),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_named_as_iptables_1_8_names_them() {
        assert_eq!(
            Backend::Nft.program(Family::Ipv4, "restore"),
            "iptables-nft-restore"
        );
        assert_eq!(
            Backend::Legacy.program(Family::Ipv6, "save"),
            "ip6tables-legacy-save"
        );
    }

    fn saved(text: &str) -> Vec<Saved> {
        vec![Saved::parse(text)]
    }

    #[test]
    fn the_backend_is_the_hosts_as_iptables_wrappers_tells_it() {
        let hint = saved("*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n");
        let rules = saved("*filter\n:FORWARD DROP [0:0]\n-A FORWARD -j DOCKER-USER\nCOMMIT\n");
        let empty = saved("");
        let pick = |nft: &Vec<Saved>, legacy: &Vec<Saved>| pick(Some(nft), Some(legacy));
        assert_eq!(pick(&empty, &empty), Backend::Nft);
        assert_eq!(pick(&empty, &rules), Backend::Legacy);
        assert_eq!(pick(&rules, &empty), Backend::Nft);
        assert_eq!(pick(&hint, &rules), Backend::Nft);
        assert_eq!(pick(&rules, &hint), Backend::Legacy);
    }

    #[test]
    fn a_backend_the_kernel_cannot_run_is_not_chosen() {
        let empty = saved("");
        assert_eq!(super::pick(None, Some(&empty)), Backend::Legacy);
        assert_eq!(super::pick(Some(&empty), None), Backend::Nft);
    }
}
