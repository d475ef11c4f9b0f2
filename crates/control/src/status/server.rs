//! The status server: one accept loop per address, HTTP/1.1 only, with timeouts and a cap on
//! open connections, so that no client, however slow or however many, can take the file
//! descriptors the rest of the daemon needs (iptables-restore for the rules' repair, the registry's
//! reconnects, netlink sockets).
//!
//! `axum::serve` has none of these knobs, and with the hyper-util features other crates of the
//! tree turn on it also speaks HTTP/2; this loop serves the same axum `Router` through hyper's
//! HTTP/1 connection instead.

use super::{NodeStatus, StatusAddr};
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// Connections each address keeps open at once. Far more than an operator, a liveness probe
/// and a Prometheus server need; both addresses together stay well below the 1024 descriptors
/// a service gets by default.
pub const MAX_CONNECTIONS: usize = 256;

/// A client has this long to send a whole request head once it connects, and again once a
/// response is written and the connection waits for the next request (hyper starts the same
/// timer for both): so this is also the keep-alive idle timeout. A client that sends nothing,
/// or half a request, is dropped after it.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// No connection stays open longer than this, whatever it does: a client that asked for
/// `/metrics` and never reads the answer holds its connection only this long.
pub const MAX_CONNECTION_TIME: Duration = Duration::from_secs(60);

/// The most of a request hyper buffers (hyper's floor is 8 KiB): a GET for one of our paths
/// is a few hundred bytes, and 256 connections each filling a 400 KiB default buffer would
/// cost 100 MB.
const MAX_BUFFER: usize = 16 * 1024;

/// A warning about closed connections or failed accepts is written at most this often.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Listen on `addr` and serve it from a task of its own.
pub(super) async fn serve(addr: StatusAddr, status: Arc<NodeStatus>) -> anyhow::Result<()> {
    let app = match addr {
        StatusAddr::Status(_) => status_router(status.clone()),
        StatusAddr::Healthz(_) => healthz_router(status.clone()),
    };
    let socket = addr.addr();
    let listener =
        listen(socket).map_err(|e| anyhow::anyhow!("cannot listen on {socket} for status: {e}"))?;
    tokio::spawn(accept_loop(listener, socket, app, status));
    Ok(())
}

/// Connections the kernel completes and queues for the accept loop. `TcpListener::bind` asks
/// for 128, which a burst of connects overflows before the loop drains it: the kernel then
/// drops SYNs, a liveness probe's among them, and the client sends its SYN again a second
/// later, as long as kubelet's default probe timeout. Queued connections cost the kernel a
/// little memory and this process no descriptor; the kernel caps this at net.core.somaxconn.
const BACKLOG: u32 = 1024;

fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    // As TcpListener::bind: a restarted node listens again at once, despite TIME_WAITs.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// `--status-addr`: everything.
fn status_router(status: Arc<NodeStatus>) -> Router {
    let router = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route(
            "/metrics",
            get(|State(s): State<Arc<NodeStatus>>| async move { s.to_prometheus() }),
        )
        .route(
            "/status",
            get(|State(s): State<Arc<NodeStatus>>| async move { Json(s.to_json()) }),
        )
        .with_state(status.clone());
    refusing_bodies(router, status)
}

/// flannel's `--healthz-port`: `/healthz` and `/readyz` and nothing else, as flanneld.
fn healthz_router(status: Arc<NodeStatus>) -> Router {
    let router = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(status.clone());
    refusing_bodies(router, status)
}

/// Every path here is a GET that takes no body, and a body framed by Transfer-Encoding is where
/// request smuggling lives: beside a Content-Length, a proxy in front and this server may read
/// the request's end in different places (RFC 9112 6.1). hyper drops the Content-Length of such
/// a request before the router sees it, so the router cannot tell the two apart, and refuses
/// every Transfer-Encoding: 400, and the connection closed, as RFC 9112 asks of a server that
/// refuses one; each counted (`twill_status_requests_refused_total`), and logged at most once
/// a minute.
fn refusing_bodies(router: Router, status: Arc<NodeStatus>) -> Router {
    let refusals = Arc::new(Refusals {
        status,
        log: Mutex::new(RateLimited::new(LOG_EVERY)),
    });
    router.layer(axum::middleware::from_fn_with_state(
        refusals,
        refuse_framed_body,
    ))
}

struct Refusals {
    status: Arc<NodeStatus>,
    log: Mutex<RateLimited>,
}

async fn refuse_framed_body(
    State(refusals): State<Arc<Refusals>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::{header, StatusCode};
    use axum::response::IntoResponse;
    if !request.headers().contains_key(header::TRANSFER_ENCODING) {
        return next.run(request).await;
    }
    refusals.status.requests_refused.fetch_add(1, Relaxed);
    if let Some(n) = refusals.log.lock().unwrap().count() {
        tracing::warn!(
            "status server: refused a request to {} with a Transfer-Encoding body \
             ({n} time(s) since this was last logged; twill_status_requests_refused_total \
             counts them all)",
            crate::shown::quoted(request.uri().path())
        );
    }
    (
        StatusCode::BAD_REQUEST,
        [(header::CONNECTION, "close")],
        "the status server takes no request body\n",
    )
        .into_response()
}

/// 200 while the process runs, as flanneld's: what twill can repair it repairs itself, and a
/// restart would repair nothing more ([`readyz`] says what is wrong meanwhile).
async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(s): State<Arc<NodeStatus>>) -> (axum::http::StatusCode, String) {
    s.readiness_answer()
}

async fn accept_loop(
    listener: TcpListener,
    addr: SocketAddr,
    app: Router,
    status: Arc<NodeStatus>,
) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true)
        .max_buf_size(MAX_BUFFER);
    let open = Arc::new(Mutex::new(Open::default()));
    let mut evictions = RateLimited::new(LOG_EVERY);
    let mut failures = RateLimited::new(LOG_EVERY);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // A connection the client reset before it was accepted is gone: next. Anything
                // else (EMFILE: no descriptor left) would fail again at once, so wait a little;
                // the connection stays in the backlog meanwhile.
                let reset = matches!(
                    e.kind(),
                    ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
                );
                if !reset {
                    if let Some(n) = failures.count() {
                        tracing::warn!(
                            "status server on {addr}: accepting a connection failed \
                             ({n} time(s) since this was last logged): {e}"
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                continue;
            }
        };
        // Past the cap the oldest connection is closed, rather than the new one refused or
        // left in the backlog. A flood of idle connections then cannot keep a liveness probe
        // out: the probe's connection is accepted and served at once (a GET of /healthz takes
        // well under a millisecond, while it would take another MAX_CONNECTIONS connections
        // to displace it), and the idle ones it displaces had nothing to lose. Refused, or
        // left in the backlog behind the flood, the probe would fail or wait until the header
        // timeout freed a slot, and for as long as a client kept reconnecting to fill them.
        let (slot, closed, evicted_one) = Open::admit(&open);
        if evicted_one {
            status.connections_evicted.fetch_add(1, Relaxed);
            if let Some(n) = evictions.count() {
                tracing::warn!(
                    "status server on {addr}: more than {MAX_CONNECTIONS} connections at once; \
                     closed the oldest to make room ({n} time(s) since this was last logged; \
                     twill_status_connections_evicted_total counts them all)"
                );
            }
        }
        tokio::spawn(serve_connection(
            stream,
            addr,
            &http,
            app.clone(),
            slot,
            closed,
        ));
    }
}

/// Serves one connection until the client or hyper ends it, a newer connection displaces it,
/// or [`MAX_CONNECTION_TIME`] passes.
fn serve_connection(
    stream: TcpStream,
    addr: SocketAddr,
    http: &http1::Builder,
    app: Router,
    slot: Slot,
    closed: oneshot::Receiver<()>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let _ = stream.set_nodelay(true);
    // HTTP/1 only: hyper's HTTP/1 connection answers no h2c upgrade (it is not asked to serve
    // upgrades at all) and takes an HTTP/2 preface for the error it is.
    let connection = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    async move {
        let _slot = slot;
        tokio::select! {
            served = connection => {
                if let Err(e) = served {
                    tracing::debug!("status connection on {addr} ended: {e}");
                }
            }
            _ = closed => tracing::debug!("status connection on {addr} closed for a newer one"),
            () = tokio::time::sleep(MAX_CONNECTION_TIME) => {
                tracing::debug!("status connection on {addr} closed after {MAX_CONNECTION_TIME:?}");
            }
        }
    }
}

/// The open connections of one address, oldest first. A connection is closed by dropping its
/// sender.
#[derive(Default)]
struct Open {
    next: u64,
    connections: BTreeMap<u64, oneshot::Sender<()>>,
}

impl Open {
    /// Makes room for a new connection: its slot, the signal that closes it, and whether the
    /// oldest connection had to be closed for it.
    fn admit(open: &Arc<Mutex<Open>>) -> (Slot, oneshot::Receiver<()>, bool) {
        let mut this = open.lock().unwrap();
        let evicted =
            this.connections.len() >= MAX_CONNECTIONS && this.connections.pop_first().is_some();
        let id = this.next;
        this.next += 1;
        let (close, closed) = oneshot::channel();
        this.connections.insert(id, close);
        let slot = Slot {
            id,
            open: open.clone(),
        };
        (slot, closed, evicted)
    }
}

/// A connection's place in [`Open`], given back when its task ends.
struct Slot {
    id: u64,
    open: Arc<Mutex<Open>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut open) = self.open.lock() {
            open.connections.remove(&self.id);
        }
    }
}

/// Counts events and says when one may be logged: the first, then at most one per period.
struct RateLimited {
    every: Duration,
    last: Option<Instant>,
    since: u64,
}

impl RateLimited {
    fn new(every: Duration) -> RateLimited {
        RateLimited {
            every,
            last: None,
            since: 0,
        }
    }

    /// Counts one event; `Some(events since the last log line)` when a line is due.
    fn count(&mut self) -> Option<u64> {
        self.since += 1;
        if self.last.is_some_and(|t| t.elapsed() < self.every) {
            return None;
        }
        self.last = Some(Instant::now());
        Some(std::mem::take(&mut self.since))
    }
}

/// Raises this process's soft limit on open files to its hard limit, as Go does for every
/// program since 1.19: systemd gives a service 1024 soft (and 524288 hard), which the status
/// server's connections, the iptables-restore processes, the registry's sockets and the TUN queues share.
/// Returns the limits (soft, hard) as they are afterwards.
pub fn raise_open_files_limit() -> std::io::Result<(libc::rlim_t, libc::rlim_t)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit, which `limit` is.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit only reads `raised`.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        limit = raised;
    }
    Ok((limit.rlim_cur, limit.rlim_max))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A status server for `addr`'s kind on a free loopback port.
    async fn server(kind: fn(SocketAddr) -> StatusAddr) -> (SocketAddr, Arc<NodeStatus>) {
        let status = Arc::new(NodeStatus::new(false));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = match kind(addr) {
            StatusAddr::Status(_) => status_router(status.clone()),
            StatusAddr::Healthz(_) => healthz_router(status.clone()),
        };
        tokio::spawn(accept_loop(listener, addr, app, status.clone()));
        (addr, status)
    }

    /// Writes `request` on a new connection and reads until the server closes it (or 5 s).
    async fn exchange(addr: SocketAddr, request: &[u8]) -> Vec<u8> {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut response = Vec::new();
        let read = stream.read_to_end(&mut response);
        let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
        response
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        let request = format!("GET {path} HTTP/1.1\r\nHost: twill\r\nConnection: close\r\n\r\n");
        String::from_utf8_lossy(&exchange(addr, request.as_bytes()).await).into_owned()
    }

    /// Whether the server closed `stream` (EOF or reset) within `bound`, after whatever it
    /// wrote first.
    async fn closed_within(stream: &mut TcpStream, bound: Duration) -> bool {
        let mut buf = [0u8; 1024];
        let until_closed = async { while let Ok(1..) = stream.read(&mut buf).await {} };
        tokio::time::timeout(bound, until_closed).await.is_ok()
    }

    #[tokio::test]
    async fn the_healthz_address_answers_the_probes_alone() {
        let (addr, status) = server(StatusAddr::Healthz).await;
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        for path in ["/status", "/metrics", "/", "/healthz/x", "/readyz/x"] {
            let response = get(addr, path).await;
            assert!(response.starts_with("HTTP/1.1 404"), "{path}: {response}");
        }
        probes_follow_the_node(addr, &status).await;
    }

    #[tokio::test]
    async fn the_status_address_answers_everything() {
        let (addr, status) = server(StatusAddr::Status).await;
        for path in ["/healthz", "/status", "/metrics"] {
            let response = get(addr, path).await;
            assert!(response.starts_with("HTTP/1.1 200"), "{path}: {response}");
        }
        let metrics = get(addr, "/metrics").await;
        assert!(
            metrics.contains("\ntwill_status_connections_evicted_total 0\n"),
            "{metrics}"
        );
        probes_follow_the_node(addr, &status).await;
    }

    /// `/readyz` is 503 until the node is ready, then 200, and 503 with the reason while it
    /// cannot forward; `/healthz` is 200 throughout, as flanneld's.
    async fn probes_follow_the_node(addr: SocketAddr, status: &NodeStatus) {
        let healthy = |response: String| response.starts_with("HTTP/1.1 200");
        let response = get(addr, "/readyz").await;
        assert!(response.starts_with("HTTP/1.1 503"), "{response}");
        assert!(response.ends_with("not in place yet\n"), "{response}");
        assert!(healthy(get(addr, "/healthz").await));
        status.set_ready();
        assert!(get(addr, "/readyz").await.ends_with("\r\n\r\nready\n"));
        status.set_unhealthy(Some("device twill0 is down".into()));
        let response = get(addr, "/readyz").await;
        assert!(response.starts_with("HTTP/1.1 503"), "{response}");
        assert!(response.ends_with("device twill0 is down\n"), "{response}");
        assert!(healthy(get(addr, "/healthz").await));
        status.set_unhealthy(None);
        assert!(healthy(get(addr, "/readyz").await));
        assert!(get(addr, "/healthz").await.ends_with("\r\n\r\nok\n"));
    }

    /// No HTTP/2 with prior knowledge (an HTTP/2 server answers the preface with a SETTINGS
    /// frame) and no h2c upgrade (101).
    #[tokio::test]
    async fn only_http_1_1_is_spoken() {
        let (addr, _) = server(StatusAddr::Status).await;
        let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        preface.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        let response = exchange(addr, &preface).await;
        let settings = response.len() >= 9 && response[3] == 4;
        assert!(!settings, "answered as HTTP/2: {response:?}");
        let upgrade =
            "GET /healthz HTTP/1.1\r\nHost: twill\r\nConnection: Upgrade, HTTP2-Settings\r\n\
                       Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n";
        let response = exchange(addr, upgrade.as_bytes()).await;
        let response = String::from_utf8_lossy(&response);
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    }

    /// Past the cap the oldest connection goes, counted, and `/healthz` answers at once.
    #[tokio::test]
    async fn past_the_cap_the_oldest_connection_is_closed() {
        raise_open_files_limit().unwrap();
        let (addr, status) = server(StatusAddr::Status).await;
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS + 10 {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        assert!(closed_within(&mut idle[0], Duration::from_secs(2)).await);
        let started = Instant::now();
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(status.connections_evicted.load(Relaxed), 11);
        let newest = idle.last_mut().unwrap();
        assert!(!closed_within(newest, Duration::from_millis(200)).await);
    }

    /// A client that sends nothing, or half a request, is dropped after the header timeout;
    /// so is one idle after its answer (keep-alive).
    #[tokio::test]
    async fn idle_and_half_requests_are_dropped_after_the_header_timeout() {
        let (addr, _) = server(StatusAddr::Status).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut half = TcpStream::connect(addr).await.unwrap();
        half.write_all(b"GET /status HTTP/1.1\r\nHost: tw")
            .await
            .unwrap();
        let mut kept = TcpStream::connect(addr).await.unwrap();
        kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: twill\r\n\r\n")
            .await
            .unwrap();
        let mut answer = [0u8; 256];
        let n = kept.read(&mut answer).await.unwrap();
        assert!(answer[..n].starts_with(b"HTTP/1.1 200"));
        let bound = HEADER_READ_TIMEOUT + Duration::from_secs(2);
        let started = Instant::now();
        for stream in [&mut silent, &mut half, &mut kept] {
            assert!(closed_within(stream, bound).await);
        }
        assert!(started.elapsed() >= HEADER_READ_TIMEOUT - Duration::from_secs(1));
    }

    #[test]
    fn warnings_are_rate_limited() {
        let mut limited = RateLimited::new(Duration::from_millis(100));
        assert_eq!(limited.count(), Some(1));
        assert_eq!(limited.count(), None);
        assert_eq!(limited.count(), None);
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(limited.count(), Some(3));
    }
}
