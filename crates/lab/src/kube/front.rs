//! A plain-HTTP front for the lab's API server, as a proxy between a node and its API server
//! is: it forwards every request (as the server's admin), until told to answer every request
//! itself with 200 and a body that is not what the API promises: an empty one (a watch that
//! ends at once) or JSON cut short (a proxy that cut the response). It counts the requests it
//! answered so, by kind, so a test sees how hard a node pulls on a broken server.

use super::KubeApiServer;
use anyhow::{Context, Result};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use tokio::sync::oneshot;

/// What the front answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Answer {
    /// Forwards to the API server.
    Forward = 0,
    /// 200, `application/json`, no body.
    Empty = 1,
    /// 200, `application/json`, the first bytes of a NodeList (a watch event for a watch).
    Truncated = 2,
}

/// Requests the front answered itself, by kind.
#[derive(Debug, Default)]
pub struct Answered {
    pub watches: AtomicU64,
    pub others: AtomicU64,
}

pub struct ApiFront {
    addr: SocketAddr,
    answer: Arc<AtomicU8>,
    answered: Arc<Answered>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ApiFront {
    /// A front for `api` on `ip` (a free port), in the server's namespace.
    pub fn start(api: &KubeApiServer, ip: Ipv4Addr) -> Result<ApiFront> {
        let answer = Arc::new(AtomicU8::new(Answer::Forward as u8));
        let answered = Arc::new(Answered::default());
        let (stop, stopped) = oneshot::channel();
        let (bound, addr) = std::sync::mpsc::channel();
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&api.kubeconfig(api.admin_token()))?;
        let ns = api.ns.clone();
        let (answer_, answered_) = (Arc::clone(&answer), Arc::clone(&answered));
        let thread = std::thread::spawn(move || {
            let served = serve(ns, ip, kubeconfig, answer_, answered_, stopped, &bound);
            if let Err(e) = served {
                let _ = bound.send(Err(e));
            }
        });
        let addr = addr.recv().context("the API front's thread died")??;
        Ok(ApiFront {
            addr,
            answer,
            answered,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// `http://IP:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set(&self, answer: Answer) {
        self.answer.store(answer as u8, Relaxed);
    }

    pub fn answered(&self) -> &Answered {
        &self.answered
    }

    /// A kubeconfig for a client of the front (plain HTTP; the front adds the credentials).
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: front\n  cluster:\n    server: {}\n\
             contexts:\n- name: front\n  context:\n    cluster: front\n    user: front\n\
             current-context: front\nusers:\n- name: front\n  user: {{}}\n",
            self.url()
        )
    }
}

impl Drop for ApiFront {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Reply = Response<UnsyncBoxBody<Bytes, BoxError>>;

fn serve(
    ns: Option<String>,
    ip: Ipv4Addr,
    kubeconfig: kube::config::Kubeconfig,
    answer: Arc<AtomicU8>,
    answered: Arc<Answered>,
    mut stopped: oneshot::Receiver<()>,
    bound: &std::sync::mpsc::Sender<Result<SocketAddr>>,
) -> Result<()> {
    if let Some(ns) = &ns {
        let file = std::fs::File::open(format!("/var/run/netns/{ns}"))?;
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let options = kube::config::KubeConfigOptions::default();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?;
        let client = kube::Client::try_from(config)?;
        let listener = tokio::net::TcpListener::bind((ip, 0)).await?;
        let _ = bound.send(Ok(listener.local_addr()?));
        loop {
            let (stream, _) = tokio::select! {
                _ = &mut stopped => return Ok(()),
                accepted = listener.accept() => accepted?,
            };
            let (client, answer, answered) = (client.clone(), answer.clone(), answered.clone());
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let (client, answer, answered) =
                        (client.clone(), answer.clone(), answered.clone());
                    async move {
                        let reply = reply(&client, &answer, &answered, request).await;
                        Ok::<_, std::convert::Infallible>(reply.unwrap_or_else(bad_gateway))
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

async fn reply(
    client: &kube::Client,
    answer: &Arc<AtomicU8>,
    answered: &Answered,
    request: Request<Incoming>,
) -> Result<Reply, BoxError> {
    let watch = request
        .uri()
        .query()
        .is_some_and(|q| q.contains("watch=true") || q.contains("watch=1"));
    let canned = match answer.load(Relaxed) {
        1 => Some(Bytes::new()),
        2 if watch => Some(Bytes::from_static(
            br#"{"type":"ADDED","object":{"kind":"Node","apiVersi"#,
        )),
        2 => Some(Bytes::from_static(
            br#"{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"#,
        )),
        _ => None,
    };
    if let Some(body) = canned {
        let count = match watch {
            true => &answered.watches,
            false => &answered.others,
        };
        count.fetch_add(1, Relaxed);
        let body = Full::new(body).map_err(never).boxed_unsync();
        return Ok(Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(body)?);
    }
    let (parts, body) = request.into_parts();
    let bytes = body.collect().await?.to_bytes();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut forward = http::Request::builder().method(parts.method).uri(path);
    for (name, value) in &parts.headers {
        if name != http::header::HOST && name != http::header::AUTHORIZATION {
            forward = forward.header(name, value);
        }
    }
    let response = client
        .send(forward.body(kube::client::Body::from(bytes.to_vec()))?)
        .await?;
    let answer = Arc::clone(answer);
    Ok(response.map(|body| {
        let cut = Cut {
            body,
            answer,
            look: Box::pin(tokio::time::sleep(LOOK_EVERY)),
        };
        cut.map_err(boxed).boxed_unsync()
    }))
}

/// How often a forwarded answer looks whether the front was switched.
const LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// A forwarded answer, which ends when the front stops forwarding: a watch open through it is
/// cut then, as a proxy that starts cutting responses cuts it.
struct Cut {
    body: kube::client::Body,
    answer: Arc<AtomicU8>,
    look: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl hyper::body::Body for Cut {
    type Data = Bytes;
    type Error = kube::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, kube::Error>>> {
        use std::task::Poll;
        if self.answer.load(Relaxed) != Answer::Forward as u8 {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = std::pin::Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        while std::future::Future::poll(self.look.as_mut(), cx).is_ready() {
            if self.answer.load(Relaxed) != Answer::Forward as u8 {
                return Poll::Ready(None);
            }
            let next = tokio::time::Instant::now() + LOOK_EVERY;
            self.look.as_mut().reset(next);
        }
        Poll::Pending
    }
}

/// What the front answers when the API server could not be asked.
fn bad_gateway(e: BoxError) -> Reply {
    let body = Full::new(Bytes::from(e.to_string()))
        .map_err(never)
        .boxed_unsync();
    let mut reply = Response::new(body);
    *reply.status_mut() = hyper::StatusCode::BAD_GATEWAY;
    reply
}

fn never(e: std::convert::Infallible) -> BoxError {
    match e {}
}

fn boxed(e: kube::Error) -> BoxError {
    Box::new(e)
}
