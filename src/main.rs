//! `twill`: the command lines. One binary with three faces, chosen by the name it is started
//! under and its first argument:
//! - `twill run ...` and `twill status` (twill's own command line, [`twill_cli`]);
//! - flanneld's command line, started as `flanneld` or with flags and no subcommand ([`flanneld`]), so
//!   that it replaces flanneld under flanneld's unit or in flannel's manifest unchanged;
//! - `install-conf SRC DEST`, flannel's image's tool that installs the CNI config
//!   ([`install_conf`]).
//!
//! Parsing and wiring only: each face turns its command line into `twill_control`'s options;
//! the work is in twill-control and twill-dataplane.

mod flanneld;
mod install_conf;
mod logging;
mod twill_cli;

use std::ffi::OsString;
use std::path::Path;
use tokio_util::sync::CancellationToken;
use twill_control::launch::Launch;
use twill_control::status;

/// jemalloc, not glibc's malloc: glibc gives the threads that allocate arenas of their own and
/// keeps what is freed in them, so a node at 60,000 leases peaked far above what it held
/// (docs/decisions.md, "The allocator").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// `--version`: the crate's version and the git commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TWILL_GIT_COMMIT"),
    ")"
);

/// Which command line the arguments are.
#[derive(Debug, PartialEq, Eq)]
enum Face {
    Twill,
    Flanneld,
    InstallConf,
}

impl Face {
    /// `args` with the program's name first.
    fn of(args: &[OsString]) -> Face {
        let program = args.first().map(|p| Path::new(p).file_name().unwrap_or(p));
        match program.and_then(|p| p.to_str()) {
            Some("install-conf") => return Face::InstallConf,
            Some("flanneld") => return Face::Flanneld,
            _ => {}
        }
        // Under twill's own name a first word that is no flag is a subcommand, a mistyped one
        // too (`twill stauts`), which clap refuses with a usage line and a suggestion: taken
        // as flanneld's command line with the word ignored (flanneld's own behaviour), it
        // started a node.
        match args.get(1).and_then(|a| a.to_str()) {
            Some(twill_cli::RUN | twill_cli::STATUS | twill_cli::HELP) => Face::Twill,
            Some(word) if !word.starts_with('-') => Face::Twill,
            _ => Face::Flanneld,
        }
    }
}

fn main() {
    let args: Vec<OsString> = std::env::args_os().collect();
    let code = match Face::of(&args) {
        Face::Twill => twill_cli::main(),
        Face::Flanneld => flanneld::main(&args),
        Face::InstallConf => install_conf::main(&args),
    };
    std::process::exit(code)
}

/// Runs a node until SIGINT, SIGTERM or SIGHUP; the exit code.
fn run(launch: Launch) -> i32 {
    raise_open_files_limit();
    let result = (|| {
        let runtime = tokio::runtime::Runtime::new()?;
        let stop = CancellationToken::new();
        runtime.spawn(cancel_on_signal(stop.clone()));
        runtime.block_on(launch.run(stop))
    })();
    exit_code(result)
}

/// 0, or 1 with the error on stderr in one line.
fn exit_code(result: anyhow::Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("twill: {e:#}");
            1
        }
    }
}

/// systemd starts a service with 1024 open files (soft; 524288 hard): raise it to the hard
/// limit, so that no burst of connections to the status server, nor a large network's sockets,
/// leaves the rules' repair or the registry's reconnects without a descriptor. The status
/// server caps its connections either way ([`status::MAX_CONNECTIONS`] per address).
fn raise_open_files_limit() {
    match status::raise_open_files_limit() {
        Ok((soft, hard)) => tracing::debug!("open files limit: {soft} (hard {hard})"),
        Err(e) => tracing::warn!("cannot raise the open files limit to its hard limit: {e}"),
    }
}

/// Cancels `stop` on SIGINT, SIGTERM or SIGHUP, so each stops the node cleanly (lease and rules
/// kept, as flanneld keeps them). SIGHUP is not a reload: twill reads its config only at start,
/// and a hangup left to its default would kill it without stopping its dataplane cleanly.
async fn cancel_on_signal(stop: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut hangup = signal(SignalKind::hangup()).expect("SIGHUP handler");
    let name = tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
        _ = hangup.recv() => "SIGHUP",
    };
    tracing::info!("{name}: shutting down");
    stop.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn face(line: &[&str]) -> Face {
        let args: Vec<OsString> = line.iter().map(OsString::from).collect();
        Face::of(&args)
    }

    #[test]
    fn the_face_follows_the_name_and_the_first_argument() {
        assert_eq!(
            face(&["/usr/bin/twill", "run", "--iface", "eth0"]),
            Face::Twill
        );
        assert_eq!(face(&["twill", "status"]), Face::Twill);
        assert_eq!(face(&["twill", "help"]), Face::Twill);
        assert_eq!(
            face(&["twill", "--ip-masq", "--kube-subnet-mgr"]),
            Face::Flanneld
        );
        assert_eq!(face(&["twill"]), Face::Flanneld);
        // A mistyped subcommand is twill's to refuse, not flanneld's to ignore.
        assert_eq!(face(&["twill", "stauts"]), Face::Twill);
        assert_eq!(face(&["/opt/bin/flanneld", "stauts"]), Face::Flanneld);
        assert_eq!(face(&["/opt/bin/flanneld", "run"]), Face::Flanneld);
        assert_eq!(
            face(&["/opt/bin/install-conf", "a", "b"]),
            Face::InstallConf
        );
    }
}
