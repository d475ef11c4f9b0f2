use crate::proc::{run, Proc};
use anyhow::Result;
use nix::sched::{setns, CloneFlags};
use std::fs::File;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

/// Names stay short enough to read in `ip netns list` output.
const MAX_NAME: usize = 30;

/// A network namespace created with `ip netns add`, deleted (with everything in it) on Drop; or
/// a name given to another process's namespace ([`Netns::attach`]), of which only the name goes.
#[derive(Debug)]
pub struct Netns {
    name: String,
    owned: bool,
}

impl Netns {
    /// Creates `tw<pid>-<counter>-<name>` (cut to 30 chars) with loopback up. `name` only helps
    /// humans; the pid and a process-wide counter make it unique across parallel tests.
    pub fn new(name: &str) -> Result<Netns> {
        crate::require_root()?;
        sweep_once();
        let name = unique_name(name);
        run(Command::new("ip").args(["netns", "add", &name]))?;
        let ns = Netns { name, owned: true };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Names the network namespace of process `pid` (e.g. a pod's) `tw<pid>-<counter>-<name>`,
    /// so the helpers here run in it. Drop removes the name and leaves the namespace and its
    /// processes alone.
    pub fn attach(name: &str, pid: u32) -> Result<Netns> {
        crate::require_root()?;
        sweep_once();
        let name = unique_name(name);
        run(Command::new("ip").args(["netns", "attach", &name, &pid.to_string()]))?;
        Ok(Netns { name, owned: false })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Run a command inside (ip netns exec), wait, return stdout; Err with the command line +
    /// stderr when exit != 0.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<String> {
        run(&mut command_in(Some(&self.name), program, args))
    }

    /// Run `sh -c script` inside, same error rules as [`Netns::exec`].
    pub fn sh(&self, script: &str) -> Result<String> {
        self.exec("sh", &["-c", script])
    }

    /// The counter `counter` of `device` inside (`tx_packets`, `rx_bytes`, ...: its
    /// /sys/class/net statistics, read from within, where /sys shows this namespace's devices).
    pub fn device_counter(&self, device: &str, counter: &str) -> Result<u64> {
        let path = format!("/sys/class/net/{device}/statistics/{counter}");
        Ok(self.exec("cat", &[&path])?.trim().parse()?)
    }

    /// `ip -n <ns> args...`: cheaper than `exec("ip", ..)` as it needs no mount namespace.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        run(Command::new("ip").args(["-n", &self.name]).args(args))
    }

    /// Start a long-running process inside; stdout/stderr go to files readable through [`Proc`].
    /// Killed (SIGTERM, then SIGKILL after 2 s) on Drop of the Proc.
    pub fn spawn(&self, program: &str, args: &[&str]) -> Result<Proc> {
        self.spawn_with(program, args, &[])
    }

    /// [`Netns::spawn`] with extra environment variables.
    pub fn spawn_with(&self, program: &str, args: &[&str], env: &[(&str, &str)]) -> Result<Proc> {
        let mut cmd = command_in(Some(&self.name), program, args);
        cmd.envs(env.iter().copied());
        Proc::spawn(cmd)
    }

    /// Run `f` on a fresh OS thread that has setns()'d into this namespace and return its value.
    /// Threads started by `f` (e.g. a tokio runtime built inside it) inherit the namespace.
    /// Panics if the namespace cannot be entered; a panic in `f` propagates.
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::scope(|scope| {
            let thread = scope.spawn(move || {
                let file = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
                setns(&file, CloneFlags::CLONE_NEWNET)
                    .unwrap_or_else(|e| panic!("setns into {path}: {e}"));
                f()
            });
            thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let deleted = match self.owned {
            true => crate::stale::delete(&self.name),
            false => run(Command::new("ip").args(["netns", "del", &self.name])).map(drop),
        };
        if let Err(e) = deleted {
            tracing::warn!("cannot delete netns {}: {e:#}", self.name);
        }
    }
}

/// Namespaces left by crashed earlier runs are swept before this process adds its first one.
fn sweep_once() {
    static SWEEP: Once = Once::new();
    SWEEP.call_once(|| {
        if let Err(e) = crate::stale::cleanup_stale() {
            tracing::warn!("cleanup of stale lab namespaces failed: {e:#}");
        }
    });
}

fn unique_name(name: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let counter = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut full = format!("tw{}-{counter}-", std::process::id());
    let room = MAX_NAME.saturating_sub(full.len());
    full.extend(
        name.chars()
            .map(|c| match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' => c,
                _ => '_',
            })
            .take(room),
    );
    full
}

/// `program args` in the root namespace for `None`, via `ip netns exec` otherwise.
pub(crate) fn command_in(ns: Option<&str>, program: &str, args: &[&str]) -> Command {
    let mut cmd = match ns {
        Some(ns) => {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", ns, program]);
            cmd
        }
        None => Command::new(program),
    };
    cmd.args(args);
    cmd
}
