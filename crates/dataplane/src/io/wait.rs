//! Writes that wait for room without a runtime.
//!
//! An engine's writers (UDP sends, TUN writes) are registered with no reactor: a descriptor
//! registered for writability is woken each time the kernel frees a sent buffer, and every such
//! wake-up ends the owning thread's sleep for nothing. The queues they write to almost never fill
//! (7 MB socket buffers, a TUN takes every write), so a full queue is met here, by the writing
//! thread itself, with a bounded poll(2).

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::io;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

/// How long a write waits for a full queue to drain before it counts as failed: far above any
/// drain time on a working path, short enough that a stopping engine is not held up by it.
const LONGEST_WAIT: Duration = Duration::from_millis(500);

/// Run `op`, a non-blocking write on `fd`; while it finds the queue full, wait until the queue
/// takes more (at most [`LONGEST_WAIT`] in all) and run it again.
pub(crate) fn until_writable<R>(
    fd: BorrowedFd<'_>,
    mut op: impl FnMut() -> io::Result<R>,
) -> io::Result<R> {
    let deadline = Instant::now() + LONGEST_WAIT;
    loop {
        match op() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(e);
                }
                let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
                let timeout = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
                match poll(&mut fds, timeout) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(errno) => return Err(errno.into()),
                }
            }
            result => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixDatagram;

    #[test]
    fn a_full_queue_fails_after_the_longest_wait_and_a_draining_one_succeeds() {
        let (tx, rx) = UnixDatagram::pair().unwrap();
        tx.set_nonblocking(true).unwrap();
        while tx.send(&[0; 1024]).is_ok() {}
        let started = Instant::now();
        let full = until_writable(tx.as_fd(), || tx.send(&[0; 1024]));
        assert_eq!(full.unwrap_err().kind(), io::ErrorKind::WouldBlock);
        assert!(started.elapsed() >= LONGEST_WAIT);

        rx.set_nonblocking(true).unwrap();
        let drain = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let mut buf = [0; 1024];
            while rx.recv(&mut buf).is_ok() {}
            rx // still open for the send below
        });
        assert_eq!(
            until_writable(tx.as_fd(), || tx.send(&[1; 1024])).unwrap(),
            1024
        );
        drop(drain.join().unwrap());
    }
}
