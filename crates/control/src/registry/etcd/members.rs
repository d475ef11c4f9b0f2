//! Which of `--etcd-endpoints` the client sends requests to. etcd-client balances over every
//! endpoint it was given, a dead one too: tonic's balancer hands it requests, which fail, and
//! each failure cost a backoff, so a dead endpoint first (flanneld's default list where only
//! 2379 is up) made a start take up to 40 s to its lease. grpc-go, under flanneld, picks only
//! endpoints whose connection is up; twill does the same by a TCP connect: only endpoints that
//! accept one are in the client's pool, looked at again every [`LOOK_EVERY`], and every
//! endpoint when none does (then the requests fail as etcd being down, and are retried).

use etcd_client::Client;
use futures::stream::{FuturesUnordered, StreamExt};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;
use tracing::{info, warn};

/// How often the endpoints are looked at again once connected.
const LOOK_EVERY: Duration = Duration::from_secs(5);
/// How long a TCP connect to one endpoint may take.
const CONNECT_WITHIN: Duration = Duration::from_secs(1);
/// Once one endpoint answered, how much longer the first look waits for the others: a
/// blackholed endpoint must not hold a start for [`CONNECT_WITHIN`]; it joins at a later look.
const GRACE: Duration = Duration::from_millis(250);

/// An endpoint as etcd-client keys it: with its scheme (etcd-client puts `http://`, or
/// `https://` with TLS, before one written without).
pub(super) fn url(endpoint: &str, tls: bool) -> String {
    match endpoint.contains("://") {
        true => endpoint.to_string(),
        false if tls => format!("https://{endpoint}"),
        false => format!("http://{endpoint}"),
    }
}

/// `host:port` of an endpoint URL, the scheme's port when it names none.
fn authority(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    let host = uri.host()?;
    let port = uri
        .port_u16()
        .unwrap_or(if uri.scheme_str() == Some("https") {
            443
        } else {
            80
        });
    Some(format!("{host}:{port}"))
}

/// The pool to send requests to: the endpoints of `all` that accept a TCP connection now, in
/// `all`'s order, and whether any did; every one of them when none does.
pub(super) async fn pool(all: &[String]) -> (Vec<String>, bool) {
    let started = Instant::now();
    let mut looks: FuturesUnordered<_> = all
        .iter()
        .enumerate()
        .map(|(i, url)| async move { (i, accepts(url).await) })
        .collect();
    let mut live = Vec::new();
    loop {
        let wait = match live.is_empty() {
            true => CONNECT_WITHIN,
            false => GRACE.saturating_sub(started.elapsed()),
        };
        match tokio::time::timeout(wait, looks.next()).await {
            Ok(Some((i, true))) => live.push(i),
            Ok(Some((_, false))) => {}
            Ok(None) | Err(_) => break,
        }
    }
    if live.is_empty() {
        return (all.to_vec(), false);
    }
    live.sort();
    (live.into_iter().map(|i| all[i].clone()).collect(), true)
}

async fn accepts(url: &str) -> bool {
    let Some(authority) = authority(url) else {
        return false;
    };
    let connect = TcpStream::connect(authority);
    matches!(
        tokio::time::timeout(CONNECT_WITHIN, connect).await,
        Ok(Ok(_))
    )
}

/// Keeps `client`'s pool ([`pool`]) to the endpoints of `all` that answer, starting from
/// `pool`, until the handle drops. Says each change once.
pub(super) fn keep(
    client: Client,
    all: Vec<String>,
    mut pool: Vec<String>,
) -> AbortOnDropHandle<()> {
    AbortOnDropHandle::new(tokio::spawn(async move {
        loop {
            tokio::time::sleep(LOOK_EVERY).await;
            let (now, any) = self::pool(&all).await;
            if !any && now != pool {
                warn!(
                    "no etcd endpoint answers ({}): requests go to every one until one does",
                    all.join(",")
                );
            }
            for url in now.iter().filter(|u| !pool.contains(u)) {
                match client.add_endpoint(url).await {
                    Ok(()) if any => info!("etcd at {url} answers: requests go to it too"),
                    Ok(()) => {}
                    Err(e) => warn!("cannot send requests to etcd at {url}: {e}"),
                }
            }
            for url in pool.iter().filter(|u| !now.contains(u)) {
                match client.remove_endpoint(url).await {
                    Ok(()) => warn!("etcd at {url} does not answer: no requests go to it"),
                    Err(e) => warn!("cannot take etcd at {url} out of the pool: {e}"),
                }
            }
            pool = now;
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_keyed_with_its_scheme_and_reached_at_its_port() {
        assert_eq!(url("10.0.0.1:2379", false), "http://10.0.0.1:2379");
        assert_eq!(url("10.0.0.1:2379", true), "https://10.0.0.1:2379");
        assert_eq!(url("https://e:2379", false), "https://e:2379");
        assert_eq!(authority("http://10.0.0.1:4001").unwrap(), "10.0.0.1:4001");
        assert_eq!(
            authority("https://etcd.example").unwrap(),
            "etcd.example:443"
        );
        assert_eq!(
            authority("http://[fd00::1]:2379").unwrap(),
            "[fd00::1]:2379"
        );
        assert_eq!(authority("http://"), None);
    }

    #[tokio::test]
    async fn only_endpoints_that_accept_a_connection_are_in_the_pool_unless_none_does() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let live = format!("http://{}", listener.local_addr().unwrap());
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let all = vec![dead.clone(), live.clone()];
        assert_eq!(pool(&all).await, (vec![live], true));
        let none = vec![dead];
        assert_eq!(pool(&none).await, (none, false));
    }
}
