//! Paces watches that end at once. kube-runtime's watcher starts a new watch as soon as one
//! ends, without an error and without a wait, so an API server address that answers a watch
//! with 200 and nothing (a proxy cutting responses, a broken load balancer) made a node
//! re-request tens of thousands of times in ten seconds, silently. A watch that ends within
//! [`AT_ONCE`] without one whole event is such an answer: the next watch waits, doubling from
//! the registry's backoff to its bound, until a watch works again; the first of an episode is
//! logged with the answer's first bytes, and its end once. client-go's reflector waits between
//! watches the same way.

use crate::registry::Backoff;
use crate::shown;
use hyper::body::{Body, Bytes, Frame};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;
use tower::{Layer, Service};

/// A watch shorter than this, with no whole event, ended at once.
const AT_ONCE: Duration = Duration::from_secs(1);
/// How much of an answer the log line quotes.
const QUOTED: usize = 64;

/// The layer that paces the watches of every request through it.
#[derive(Clone)]
pub struct WatchPaceLayer(Arc<Mutex<Pace>>);

impl WatchPaceLayer {
    pub fn new(backoff: Backoff) -> WatchPaceLayer {
        WatchPaceLayer(Arc::new(Mutex::new(Pace {
            backoff,
            at_once: 0,
        })))
    }
}

impl<S> Layer<S> for WatchPaceLayer {
    type Service = WatchPace<S>;

    fn layer(&self, inner: S) -> WatchPace<S> {
        WatchPace {
            inner,
            pace: Arc::clone(&self.0),
        }
    }
}

/// How the watches went lately.
struct Pace {
    backoff: Backoff,
    /// Watches in a row that ended at once.
    at_once: u32,
}

impl Pace {
    /// How long the next watch waits.
    fn delay(&mut self) -> Duration {
        match self.at_once {
            0 => Duration::ZERO,
            _ => self.backoff.next_delay(),
        }
    }

    /// A watch ended; one that sent a whole event was counted as working when it did.
    fn ended(&mut self, watch: &Watch) {
        if watch.whole_event {
            return;
        }
        // A long watch with nothing in it is the server's own timeout: it worked.
        if watch.started.elapsed() >= AT_ONCE {
            return self.worked();
        }
        if self.at_once == 0 {
            tracing::warn!(
                "the API server ended a watch at once, without an event (it sent {} bytes: {}); \
                 watching again with a backoff until a watch works",
                watch.bytes,
                shown::quoted(&String::from_utf8_lossy(&watch.first))
            );
        }
        self.at_once += 1;
    }

    fn worked(&mut self) {
        if self.at_once > 0 {
            let n = self.at_once;
            tracing::info!("the API server's watches work again, after {n} that ended at once");
            self.backoff.reset();
        }
        self.at_once = 0;
    }
}

#[derive(Clone)]
pub struct WatchPace<S> {
    inner: S,
    pace: Arc<Mutex<Pace>>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for WatchPace<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    ReqBody: Send + 'static,
{
    type Response = http::Response<Paced<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let watch = is_watch(request.uri());
        // The service polled ready is the one to call; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let pace = Arc::clone(&self.pace);
        Box::pin(async move {
            if !watch {
                let response = inner.call(request).await?;
                return Ok(response.map(|body| Paced { body, watch: None }));
            }
            let delay = pace.lock().unwrap().delay();
            tokio::time::sleep(delay).await;
            let started = Instant::now();
            let response = inner.call(request).await?;
            Ok(response.map(|body| Paced {
                body,
                watch: Some(Watch {
                    pace,
                    started,
                    bytes: 0,
                    first: Vec::new(),
                    whole_event: false,
                }),
            }))
        })
    }
}

/// A watch to pace: one that asks for a watch, and not a probe that asks to end within
/// [`AT_ONCE`] itself (`timeoutSeconds=1`, as the start's check that watching is allowed).
fn is_watch(uri: &http::Uri) -> bool {
    let Some(query) = uri.query() else {
        return false;
    };
    let mut params = query.split('&');
    let watch = params.clone().any(|p| p == "watch=true" || p == "watch=1");
    let probe = params.any(|p| {
        p.strip_prefix("timeoutSeconds=")
            .and_then(|t| t.parse::<u64>().ok())
            .is_some_and(|t| Duration::from_secs(t) <= AT_ONCE)
    });
    watch && !probe
}

/// One watch's answer, as far as it went.
struct Watch {
    pace: Arc<Mutex<Pace>>,
    started: Instant,
    bytes: usize,
    first: Vec<u8>,
    /// A newline arrived: the server sent a whole event (or bookmark).
    whole_event: bool,
}

impl Watch {
    fn saw(&mut self, data: &Bytes) {
        self.bytes += data.len();
        let room = QUOTED.saturating_sub(self.first.len());
        self.first.extend_from_slice(&data[..room.min(data.len())]);
        if !self.whole_event && data.contains(&b'\n') {
            self.whole_event = true;
            self.pace.lock().unwrap().worked();
        }
    }
}

impl Drop for Watch {
    /// However the answer ended (its end, an error, the watcher dropping it).
    fn drop(&mut self) {
        let pace = Arc::clone(&self.pace);
        pace.lock().unwrap().ended(self);
    }
}

/// A response body; a watch's is followed to its end.
pub struct Paced<B> {
    body: B,
    watch: Option<Watch>,
}

impl<B: Body<Data = Bytes> + Unpin> Body for Paced<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let frame = Pin::new(&mut self.body).poll_frame(cx);
        if let (Poll::Ready(Some(Ok(frame))), Some(watch)) = (&frame, self.watch.as_mut()) {
            if let Some(data) = frame.data_ref() {
                watch.saw(data);
            }
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_are_told_by_their_query() {
        let watch = |s: &str| is_watch(&s.parse().unwrap());
        assert!(watch("/api/v1/nodes?watch=true&resourceVersion=5"));
        assert!(watch("/api/v1/nodes?allowWatchBookmarks=true&watch=1"));
        assert!(!watch("/api/v1/nodes?limit=500"));
        assert!(!watch("/api/v1/nodes/watch=true"));
        assert!(!watch("/api/v1/nodes?watch=true&timeoutSeconds=1"));
        assert!(watch("/api/v1/nodes?timeoutSeconds=290&watch=true"));
    }

    #[test]
    fn watches_that_end_at_once_wait_longer_each_time_until_one_works() {
        let ms = Duration::from_millis;
        let layer = WatchPaceLayer::new(Backoff::new(ms(200), ms(700)));
        let watch = |sent: &'static [u8], lasted: Duration| {
            let mut watch = Watch {
                pace: Arc::clone(&layer.0),
                started: Instant::now() - lasted,
                bytes: 0,
                first: Vec::new(),
                whole_event: false,
            };
            watch.saw(&Bytes::from_static(sent));
            watch
        };
        let delay = || layer.0.lock().unwrap().delay();
        assert_eq!(delay(), Duration::ZERO);
        drop(watch(b"", ms(5)));
        assert_eq!([delay(), delay(), delay()], [ms(200), ms(400), ms(700)]);
        drop(watch(b"{\"type\":\"ADD", ms(5)));
        assert_eq!(delay(), ms(700));
        // A whole event, however short the watch: it works, from the event on.
        let working = watch(b"{\"type\":\"BOOKMARK\"}\n", ms(5));
        assert_eq!(delay(), Duration::ZERO);
        drop(working);
        assert_eq!(delay(), Duration::ZERO);
        drop(watch(b"", ms(5)));
        assert_eq!(delay(), ms(200));
        // A long watch with nothing (the server's own timeout) works too.
        drop(watch(b"", Duration::from_secs(290)));
        assert_eq!(delay(), Duration::ZERO);
    }
}
