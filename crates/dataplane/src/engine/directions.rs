//! Where an engine's directions run: each on its own OS thread, with its own current-thread
//! tokio runtime.
//!
//! A packet's arrival then wakes exactly the thread that forwards it. In one multi-thread
//! runtime for all directions, the worker that took the epoll event could hand the task to
//! another worker, a second wake-up, which on a VM costs ~20 µs when it crosses vCPUs
//! (docs/performance.md). So each direction opens the I/O it waits on on its own thread, where
//! it registers with that thread's runtime, and writes through descriptors no runtime watches.
//!
//! An engine declares its directions ([`Direction::new`]); [`Directions::start`] is the one
//! place that starts them, and dropping the [`Directions`] stops and joins them all.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::mpsc;
use std::thread::JoinHandle;
use tokio_util::sync::CancellationToken;

type Forwarding = Pin<Box<dyn Future<Output = ()>>>;
type Open = Box<dyn FnOnce() -> io::Result<Forwarding> + Send>;

/// One direction of an engine (TUN -> UDP for one queue, UDP -> TUN), not yet running.
pub struct Direction {
    name: String,
    open: Open,
}

impl Direction {
    /// `open` runs on the direction's own thread, inside its runtime: it opens what the
    /// direction waits on (a [`crate::io::TunReader`], a [`crate::io::UdpReceiver`]) and returns
    /// the forwarding loop, which that thread then runs until the engine stops. `name` names
    /// the thread (Linux keeps 15 bytes of it), as `top -H` and `perf` show it.
    pub fn new<F, Fut>(name: impl Into<String>, open: F) -> Direction
    where
        F: FnOnce() -> io::Result<Fut> + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        let open: Open = Box::new(move || open().map(|f| Box::pin(f) as Forwarding));
        Direction {
            name: name.into(),
            open,
        }
    }
}

/// The running directions of one engine; dropping this stops every one and waits for its
/// thread to end, so its descriptors are closed when the drop returns.
pub struct Directions {
    stop: CancellationToken,
    threads: Vec<JoinHandle<()>>,
}

impl Directions {
    /// Start each direction on its own thread; returns once every one has opened its I/O, or
    /// with the first that could not (the ones already started stop again).
    pub fn start(directions: Vec<Direction>) -> anyhow::Result<Directions> {
        let mut running = Directions {
            stop: CancellationToken::new(),
            threads: Vec::with_capacity(directions.len()),
        };
        for Direction { name, open } in directions {
            let (opened, outcome) = mpsc::sync_channel(1);
            let stop = running.stop.clone();
            let thread = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || run(open, &stop, &opened))
                .map_err(|e| anyhow::anyhow!("cannot start thread {name}: {e}"))?;
            running.threads.push(thread);
            outcome
                .recv()
                .unwrap_or_else(|_| Err(io::Error::other("its thread ended while opening")))
                .map_err(|e| anyhow::anyhow!("cannot start {name}: {e}"))?;
        }
        Ok(running)
    }
}

/// The thread of one direction: a runtime of its own, the direction's I/O opened inside it,
/// then the forwarding loop until it ends or the engine stops.
fn run(open: Open, stop: &CancellationToken, opened: &mpsc::SyncSender<io::Result<()>>) {
    let started = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .and_then(|runtime| {
            let forwarding = {
                let _inside = runtime.enter();
                open()?
            };
            Ok((runtime, forwarding))
        });
    let (runtime, forwarding) = match started {
        Ok(started) => started,
        Err(e) => {
            let _ = opened.send(Err(e));
            return;
        }
    };
    let _ = opened.send(Ok(()));
    runtime.block_on(async {
        tokio::select! {
            () = stop.cancelled() => {}
            () = forwarding => {}
        }
    });
}

impl Drop for Directions {
    fn drop(&mut self) {
        self.stop.cancel();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;

    #[test]
    fn each_direction_runs_on_its_own_named_thread_until_dropped() {
        let ended = Arc::new(AtomicUsize::new(0));
        let (names, seen) = mpsc::channel();
        let directions = (0..2).map(|i| {
            let (ended, names) = (ended.clone(), names.clone());
            Direction::new(format!("dir{i}"), move || {
                Ok(async move {
                    let _count = Ended(ended);
                    let thread = std::thread::current();
                    names.send(thread.name().map(str::to_string)).unwrap();
                    std::future::pending::<()>().await;
                })
            })
        });
        let running = Directions::start(directions.collect()).unwrap();
        let mut got: Vec<_> = (0..2).map(|_| seen.recv().unwrap()).collect();
        got.sort();
        assert_eq!(got, [Some("dir0".into()), Some("dir1".into())]);
        assert_eq!(ended.load(SeqCst), 0);
        drop(running);
        assert_eq!(
            ended.load(SeqCst),
            2,
            "both loops dropped when the drop returned"
        );
    }

    #[test]
    fn a_direction_that_cannot_open_fails_the_start_by_name() {
        let broken = Direction::new("broken", || {
            Err::<std::future::Pending<()>, _>(io::Error::other("no device"))
        });
        let err = Directions::start(vec![broken]).err().unwrap();
        assert_eq!(err.to_string(), "cannot start broken: no device");
    }

    struct Ended(Arc<AtomicUsize>);

    impl Drop for Ended {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
        }
    }
}
