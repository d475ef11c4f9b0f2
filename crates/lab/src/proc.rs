use anyhow::{bail, Context, Result};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// Marks every process the lab starts with its owner's pid, so [`crate::cleanup_stale`] can find
/// the ones whose owner died without running Drop.
pub(crate) const OWNER_ENV: &str = "TWILL_LAB_OWNER";

/// Temp files and dirs carry this prefix plus the owner's pid for the same reason.
pub(crate) fn temp_prefix() -> String {
    format!("twill-lab-{}-", std::process::id())
}

/// A long-running child process; stopped on Drop (SIGTERM, then SIGKILL after 2 s).
#[derive(Debug)]
pub struct Proc {
    child: Child,
    command: String,
    logs: TempDir,
    /// The test saw the process end (it stopped, killed or waited for it); an end it did not
    /// see is a crash worth showing the logs of.
    exit_seen: bool,
}

impl Proc {
    /// Starts `cmd` with stdin closed and stdout/stderr captured to files in a temp dir.
    pub fn spawn(mut cmd: Command) -> Result<Proc> {
        let logs = tempfile::Builder::new().prefix(&temp_prefix()).tempdir()?;
        let command = command_line(&cmd);
        let child = cmd
            .env(OWNER_ENV, std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(File::create(logs.path().join("stdout"))?)
            .stderr(File::create(logs.path().join("stderr"))?)
            .spawn()
            .with_context(|| format!("cannot start `{command}`"))?;
        Ok(Proc {
            child,
            command,
            logs,
            exit_seen: false,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.try_wait(), Ok(None))
    }

    /// The exit status if the process has ended, noting that the test saw it end.
    fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        let status = self.child.try_wait()?;
        self.exit_seen |= status.is_some();
        Ok(status)
    }

    /// SIGTERM, wait up to 5 s, then SIGKILL.
    pub fn stop(&mut self) -> Result<ExitStatus> {
        self.terminate(Duration::from_secs(5))
    }

    /// SIGKILL and reap, for crash tests.
    pub fn kill9(&mut self) {
        self.exit_seen = true;
        // Both fail only when the child is already gone, which is the goal anyway.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The exit status if the process ends within `d`, None if it is still running then.
    pub fn wait_timeout(&mut self, d: Duration) -> Result<Option<ExitStatus>> {
        let deadline = Instant::now() + d;
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(Some(status));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            std::thread::sleep(left.min(Duration::from_millis(10)));
        }
    }

    /// What the process wrote to stderr, once it has failed within `d`; an error saying
    /// `still_running` if it is still running then, or the status if it succeeded.
    pub fn failure_within(&mut self, d: Duration, still_running: &str) -> Result<String> {
        let status = self.wait_timeout(d)?.context(still_running.to_string())?;
        anyhow::ensure!(!status.success(), "{}: exit status {status}", self.command);
        Ok(self.stderr())
    }

    /// Everything the process wrote to stdout so far.
    pub fn stdout(&self) -> String {
        self.log("stdout")
    }

    /// Everything the process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.log("stderr")
    }

    /// Where the logs live, to hand to tools or keep after a failure.
    pub fn log_dir(&self) -> PathBuf {
        self.logs.path().to_path_buf()
    }

    fn log(&self, which: &str) -> String {
        std::fs::read(self.logs.path().join(which))
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    }

    fn terminate(&mut self, grace: Duration) -> Result<ExitStatus> {
        // Only signal an unreaped child: a reaped pid may already belong to someone else.
        if let Some(status) = self.try_wait()? {
            return Ok(status);
        }
        self.exit_seen = true;
        signal(self.pid(), Signal::SIGTERM);
        if let Some(status) = self.wait_timeout(grace)? {
            return Ok(status);
        }
        self.child.kill()?;
        Ok(self.child.wait()?)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // A test that fails by returning an error does not panic; a process that died under it
        // is still the first thing to look at. SIGKILL is how a namespace dropped before its
        // processes ends them, not a death of their own.
        let died = !self.exit_seen
            && matches!(self.child.try_wait(), Ok(Some(status)) if status.signal() != Some(9));
        if let Err(e) = self.terminate(Duration::from_secs(2)) {
            tracing::warn!("cannot stop `{}`: {e:#}", self.command);
        }
        // The logs vanish with the temp dir; a failing test is when they are wanted.
        if died || std::thread::panicking() {
            let how = if died { " (it ended on its own)" } else { "" };
            eprintln!(
                "--- stderr of `{}`{how} ---\n{}",
                self.command,
                tail(&self.stderr())
            );
        }
    }
}

/// `program args` as one line, to name a command in logs and errors.
pub(crate) fn command_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s| s.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Errors mean the process is already gone.
pub(crate) fn signal(pid: u32, sig: Signal) {
    let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), sig);
}

fn tail(log: &str) -> &str {
    const KEEP: usize = 4096;
    let mut start = log.len().saturating_sub(KEEP);
    while !log.is_char_boundary(start) {
        start += 1;
    }
    &log[start..]
}

/// The last `n` lines of `log`.
pub(crate) fn last_lines(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs to completion; Err names the command line and carries its stderr. Marked with the owner
/// like a [`Proc`], so a hung command outliving a crashed test is swept too.
pub(crate) fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .env(OWNER_ENV, std::process::id().to_string())
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot start `{}`", command_line(cmd)))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            command_line(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
