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
//! place that starts them, and dropping the [`Directions`] stops and joins them all. A direction
//! that ends on its own (its device gone, a panic) is reported through [`Ended`], so that the
//! daemon can stop rather than run on with one way of the path dead.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{mpsc, Arc, OnceLock};
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
    ended: Ended,
    threads: Vec<JoinHandle<()>>,
}

/// Fires when the first direction of an engine ends while the engine still runs.
#[derive(Clone, Default)]
pub struct Ended {
    fired: CancellationToken,
    first: Arc<OnceLock<String>>,
}

impl Ended {
    /// Waits until a direction has ended; returns its thread's name.
    pub async fn first(&self) -> String {
        self.fired.cancelled().await;
        self.first.get().cloned().unwrap_or_default()
    }

    fn record(&self, name: &str) {
        let _ = self.first.set(name.to_string());
        self.fired.cancel();
    }
}

impl Directions {
    /// Start each direction on its own thread; returns once every one has opened its I/O, or
    /// with the first that could not (the ones already started stop again).
    pub fn start(directions: Vec<Direction>) -> anyhow::Result<Directions> {
        let mut running = Directions {
            stop: CancellationToken::new(),
            ended: Ended::default(),
            threads: Vec::with_capacity(directions.len()),
        };
        for Direction { name, open } in directions {
            let (opened, outcome) = mpsc::sync_channel(1);
            let (stop, ended) = (running.stop.clone(), running.ended.clone());
            let thread = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || run(open, &stop, &ended, &opened))
                .map_err(|e| anyhow::anyhow!("cannot start thread {name}: {e}"))?;
            running.threads.push(thread);
            outcome
                .recv()
                .unwrap_or_else(|_| Err(io::Error::other("its thread ended while opening")))
                .map_err(|e| anyhow::anyhow!("cannot start {name}: {e}"))?;
        }
        Ok(running)
    }

    /// What fires when a direction ends before the engine is stopped.
    pub fn ended(&self) -> Ended {
        self.ended.clone()
    }
}

/// The thread of one direction: a runtime of its own, the direction's I/O opened inside it,
/// then the forwarding loop until it ends or the engine stops.
fn run(
    open: Open,
    stop: &CancellationToken,
    ended: &Ended,
    opened: &mpsc::SyncSender<io::Result<()>>,
) {
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
    let _report = ReportEnd { stop, ended };
    runtime.block_on(async {
        tokio::select! {
            () = stop.cancelled() => {}
            () = forwarding => {}
        }
    });
}

/// Reports the end of a running direction, whether its loop returned or panicked, unless the
/// engine is being stopped.
struct ReportEnd<'a> {
    stop: &'a CancellationToken,
    ended: &'a Ended,
}

impl Drop for ReportEnd<'_> {
    fn drop(&mut self) {
        if self.stop.is_cancelled() {
            return;
        }
        let name = std::thread::current()
            .name()
            .unwrap_or("a direction")
            .to_string();
        let how = if std::thread::panicking() {
            "panicked"
        } else {
            "ended"
        };
        tracing::error!(
            "{name} {how} while its engine runs: that way of the path forwards nothing"
        );
        self.ended.record(&name);
    }
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

    #[test]
    fn each_direction_runs_on_its_own_named_thread_until_dropped() {
        let ended = Arc::new(AtomicUsize::new(0));
        let (names, seen) = mpsc::channel();
        let directions = (0..2).map(|i| {
            let (ended, names) = (ended.clone(), names.clone());
            Direction::new(format!("dir{i}"), move || {
                Ok(async move {
                    let _count = CountDrop(ended);
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

    #[test]
    fn a_direction_that_ends_or_panics_fires_ended_and_a_stop_does_not() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let quits = Direction::new("quits", || Ok(async {}));
        let running = Directions::start(vec![quits]).unwrap();
        assert_eq!(runtime.block_on(running.ended().first()), "quits");

        let panics = Direction::new("panics", || {
            Ok(async {
                tokio::task::yield_now().await;
                panic!("a bug in a forwarding loop");
            })
        });
        let running = Directions::start(vec![panics]).unwrap();
        assert_eq!(runtime.block_on(running.ended().first()), "panics");

        let forever = Direction::new("forever", || Ok(std::future::pending::<()>()));
        let running = Directions::start(vec![forever]).unwrap();
        let ended = running.ended();
        drop(running);
        let fired = runtime.block_on(async {
            tokio::time::timeout(std::time::Duration::from_millis(200), ended.first()).await
        });
        assert!(fired.is_err(), "a stopped engine is not a failed one");
    }

    struct CountDrop(Arc<AtomicUsize>);

    impl Drop for CountDrop {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
        }
    }
}
