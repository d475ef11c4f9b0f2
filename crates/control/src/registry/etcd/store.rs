//! The few etcd operations twill needs, in flannel's schema, each bounded in time.
//!
//! Every request has a deadline because a request to an unreachable etcd may otherwise wait
//! for a connection forever, and the callers must get an error they can log and retry.

use crate::lease::{lease_key, parse_lease_key, subnets_prefix, Created, Lease, Subnets};
use anyhow::Context;
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KeyValue, KvClient, PutOptions, Txn, TxnOp,
    WatchClient, WatchOptions, WatchStream,
};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::task::AbortOnDropHandle;
use tracing::warn;

/// An etcd request that got no answer in time. Means "unreachable", like a transport error.
#[derive(Debug, thiserror::Error)]
#[error("etcd {what}: no answer within {timeout:?}")]
struct NoAnswer {
    what: &'static str,
    timeout: Duration,
}

/// Whether `err` means etcd could not be reached (worth retrying) rather than that it refused
/// the request (not worth retrying: bad credentials, bad TLS files, bad arguments).
pub(super) fn is_unreachable(err: &anyhow::Error) -> bool {
    use etcd_client::Error as E;
    use tonic::Code;
    err.chain().any(|e| {
        e.is::<NoAnswer>()
            || match e.downcast_ref::<E>() {
                Some(E::TransportError(_)) => true,
                Some(E::GRpcStatus(s)) => matches!(
                    s.code(),
                    Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
                ),
                _ => false,
            }
    })
}

/// Whether etcd refused a read at a revision it no longer has (compacted) or does not have yet:
/// both are gRPC's OutOfRange.
fn is_compacted(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        matches!(e.downcast_ref::<etcd_client::Error>(),
            Some(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::OutOfRange)
    })
}

/// An etcd key for the log, whatever bytes it holds.
pub(super) fn key_text(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

/// Runs one etcd request, giving up after `timeout`.
pub(super) async fn with_deadline<T>(
    what: &'static str,
    timeout: Duration,
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(timeout, request).await {
        Ok(result) => result.with_context(|| format!("etcd {what}")),
        Err(_) => Err(NoAnswer { what, timeout }.into()),
    }
}

/// One line for the log: the operation and the root cause, without the nested debug output
/// that the gRPC errors carry.
pub(super) fn describe(err: &anyhow::Error) -> String {
    let (top, root) = (err.to_string(), err.root_cause().to_string());
    if top == root {
        top
    } else {
        format!("{top}: {root}")
    }
}

/// A lease as listed, with the revision that last wrote it (for compare-and-swap). Listed
/// already shared: the keeper's table and the lease gate keep this very copy.
pub(super) struct Listed {
    pub lease: Arc<Lease>,
    pub mod_revision: i64,
}

/// All leases under the prefix, and the revision they were read at.
pub(super) struct Listing {
    pub leases: Vec<Listed>,
    /// Entries that are not leases: their key and why.
    pub unreadable: Vec<(String, String)>,
    pub revision: i64,
}

/// Largest list or watch message accepted. The whole lease table comes back as one message, and
/// gRPC's 4 MB default would cap a network at some ten thousand leases; flanneld's Go client
/// has no such cap either.
const MAX_MESSAGE: usize = 256 << 20;

/// Leases listed per request. The whole table in one answer (about 12 MB at 60,000 leases) was
/// held as etcd sent it, as decoded entries and as leases at once; a page of this many is
/// about 0.4 MB.
const LIST_PAGE: i64 = 2000;

/// How often a list starts over when etcd compacted away the revision its pages were read at.
const LIST_RESTARTS: usize = 3;

#[derive(Clone)]
pub(super) struct Store {
    client: Client,
    /// Keeps the client's pool to the endpoints that answer (`members`), while a copy lives.
    _members: Arc<AbortOnDropHandle<()>>,
    kv: KvClient,
    watch: WatchClient,
    prefix: String,
    timeout: Duration,
}

impl Store {
    pub fn new(
        client: Client,
        members: AbortOnDropHandle<()>,
        prefix: &str,
        timeout: Duration,
    ) -> Store {
        Store {
            _members: Arc::new(members),
            kv: client.kv_client().max_decoding_message_size(MAX_MESSAGE),
            watch: client.watch_client().max_decoding_message_size(MAX_MESSAGE),
            client,
            prefix: prefix.trim_end_matches('/').to_string(),
            timeout,
        }
    }

    pub fn config_key(&self) -> String {
        format!("{}/config", self.prefix)
    }

    async fn call<T>(
        &self,
        what: &'static str,
        request: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> anyhow::Result<T> {
        with_deadline(what, self.timeout, request).await
    }

    /// The raw network config, `None` if the key does not exist.
    pub async fn config_json(&self) -> anyhow::Result<Option<String>> {
        let mut c = self.client.clone();
        let resp = self
            .call("get config", c.get(self.config_key(), None))
            .await?;
        let Some(kv) = resp.kvs().first() else {
            return Ok(None);
        };
        Ok(Some(
            kv.value_str().context("config is not UTF-8")?.to_string(),
        ))
    }

    /// Every lease under `<prefix>/subnets/`, as of one revision, read [`LIST_PAGE`] keys at a
    /// time. Entries that are not leases are set aside, as flanneld skips them, so one bad key
    /// cannot stop the network. A compaction between two pages starts the list over at the
    /// newest revision: one answer of the whole table could not meet one.
    pub async fn list(&self) -> anyhow::Result<Listing> {
        let mut restarts = 0;
        loop {
            match self.list_pages().await {
                Err(e) if is_compacted(&e) && restarts < LIST_RESTARTS => {
                    restarts += 1;
                    warn!("listing leases again: {}", describe(&e));
                }
                listed => return listed,
            }
        }
    }

    async fn list_pages(&self) -> anyhow::Result<Listing> {
        let prefix = subnets_prefix(&self.prefix).into_bytes();
        let end = range_end(&prefix);
        let (mut leases, mut unreadable) = (Vec::new(), Vec::new());
        let (mut from, mut revision) = (prefix, 0);
        loop {
            let mut c = self.kv.clone();
            // Revision 0 is the newest: the first page's, at which the others are read.
            let opts = GetOptions::new()
                .with_range(end.clone())
                .with_limit(LIST_PAGE)
                .with_revision(revision);
            let mut resp = self.call("list leases", c.get(from, Some(opts))).await?;
            if revision == 0 {
                revision = resp.header().map(|h| h.revision()).unwrap_or_default();
                leases.reserve_exact(usize::try_from(resp.count()).unwrap_or_default());
            }
            let more = resp.more();
            // Taken, so that each entry's key and value are freed once parsed.
            let kvs = resp.take_kvs();
            from = match kvs.last() {
                Some(last) => [last.key(), &[0]].concat(),
                None => break,
            };
            for kv in kvs {
                match self.parse_kv(&kv) {
                    Ok(lease) => leases.push(Listed {
                        lease: Arc::new(lease),
                        mod_revision: kv.mod_revision(),
                    }),
                    Err(e) => unreadable.push((key_text(kv.key()), format!("{e:#}"))),
                }
            }
            if !more {
                break;
            }
        }
        Ok(Listing {
            leases,
            unreadable,
            revision,
        })
    }

    /// The lease at the key of `subnets`, if any.
    pub async fn get(&self, subnets: Subnets) -> anyhow::Result<Option<Listed>> {
        let mut c = self.kv.clone();
        let resp = self
            .call("get lease", c.get(lease_key(&self.prefix, subnets), None))
            .await?;
        let Some(kv) = resp.kvs().first() else {
            return Ok(None);
        };
        Ok(Some(Listed {
            lease: Arc::new(self.parse_kv(kv)?),
            mod_revision: kv.mod_revision(),
        }))
    }

    /// The lease an etcd key holds, with the key's create_revision as its creation order: the
    /// same on every node, kept by every renewal (a put to an existing key), new only when the
    /// key was deleted or expired and made again.
    pub fn parse_kv(&self, kv: &KeyValue) -> anyhow::Result<Lease> {
        let key = std::str::from_utf8(kv.key()).context("key is not UTF-8")?;
        let value = std::str::from_utf8(kv.value()).context("value is not UTF-8")?;
        let lease = Lease::from_kv(&self.prefix, key, value)?;
        Ok(lease.with_created(Created::at(kv.create_revision())))
    }

    /// The subnets a lease key names, the IPv6 one too for a dual-stack key.
    pub fn parse_key(&self, key: &[u8]) -> anyhow::Result<Subnets> {
        let key = std::str::from_utf8(key).context("key is not UTF-8")?;
        Ok(parse_lease_key(&self.prefix, key)?)
    }

    /// Creates the lease's key only if it does not exist (flannel's `Version(key) == 0` txn).
    /// `Ok(false)`: another node created it first.
    pub async fn create(&self, lease: &Lease, ttl: Duration) -> anyhow::Result<bool> {
        let key = lease.key(&self.prefix);
        self.put_when(lease, Compare::version(key, CompareOp::Equal, 0), ttl)
            .await
    }

    /// Re-puts the lease only if its key was last written at `mod_revision`, i.e. nobody
    /// changed it since we listed it.
    pub async fn replace(
        &self,
        lease: &Lease,
        mod_revision: i64,
        ttl: Duration,
    ) -> anyhow::Result<bool> {
        let key = lease.key(&self.prefix);
        self.put_when(
            lease,
            Compare::mod_revision(key, CompareOp::Equal, mod_revision),
            ttl,
        )
        .await
    }

    /// Re-puts the lease with a fresh TTL only if the key still holds exactly our value, so a
    /// renewal never overwrites a subnet that another node took after ours was deleted.
    pub async fn renew(&self, lease: &Lease, ttl: Duration) -> anyhow::Result<bool> {
        let key = lease.key(&self.prefix);
        self.put_when(
            lease,
            Compare::value(key, CompareOp::Equal, lease.to_json()),
            ttl,
        )
        .await
    }

    /// Grants a new etcd lease and puts the key on it if `compare` holds. A new etcd lease per
    /// write is what flanneld does, so both see the same TTL semantics.
    async fn put_when(
        &self,
        lease: &Lease,
        compare: Compare,
        ttl: Duration,
    ) -> anyhow::Result<bool> {
        let mut c = self.client.clone();
        let ttl_secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let grant = self
            .call("grant lease", c.lease_grant(ttl_secs, None))
            .await?;
        let put = TxnOp::put(
            lease.key(&self.prefix),
            lease.to_json(),
            Some(PutOptions::new().with_lease(grant.id())),
        );
        let txn = Txn::new().when([compare]).and_then([put]);
        let outcome = self.call("put lease", c.txn(txn)).await;
        if !matches!(outcome, Ok(ref r) if r.succeeded()) {
            // The grant would otherwise sit orphaned in etcd for a whole TTL.
            if let Err(e) = self.call("revoke lease", c.lease_revoke(grant.id())).await {
                warn!("could not revoke unused etcd lease {:x}: {e:#}", grant.id());
            }
        }
        Ok(outcome?.succeeded())
    }

    pub async fn delete(&self, subnets: Subnets) -> anyhow::Result<()> {
        let mut c = self.client.clone();
        self.call(
            "delete lease",
            c.delete(lease_key(&self.prefix, subnets), None),
        )
        .await?;
        Ok(())
    }

    /// Watches every key under the prefix from `revision` on: the leases and the config.
    pub async fn watch(&self, revision: i64) -> anyhow::Result<WatchStream> {
        let mut c = self.watch.clone();
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision);
        self.call(
            "watch leases",
            c.watch(format!("{}/", self.prefix), Some(opts)),
        )
        .await
    }
}

/// The end of the range of keys that start with `prefix` (etcd's rule: the prefix with its
/// last byte below 0xff raised by one, the 0xff bytes after it dropped).
fn range_end(prefix: &[u8]) -> Vec<u8> {
    let Some(last) = prefix.iter().rposition(|b| *b < 0xff) else {
        return vec![0];
    };
    let mut end = prefix[..=last].to_vec();
    end[last] += 1;
    end
}

#[cfg(test)]
mod tests {
    use super::{is_compacted, range_end, with_deadline};

    #[test]
    fn the_range_of_a_prefix_ends_after_its_last_key() {
        assert_eq!(
            range_end(b"/coreos.com/network/subnets/"),
            b"/coreos.com/network/subnets0"
        );
        assert_eq!(range_end(b"a\xff\xff"), b"b");
        assert_eq!(range_end(b"\xff"), [0]);
    }

    #[tokio::test]
    async fn only_a_revision_out_of_range_starts_a_list_over() {
        let refused = |status: tonic::Status| {
            with_deadline("list leases", std::time::Duration::from_secs(1), async {
                Err::<(), _>(etcd_client::Error::GRpcStatus(status))
            })
        };
        let compacted =
            tonic::Status::out_of_range("etcdserver: mvcc: required revision has been compacted");
        assert!(is_compacted(&refused(compacted).await.unwrap_err()));
        let denied = tonic::Status::permission_denied("etcdserver: permission denied");
        assert!(!is_compacted(&refused(denied).await.unwrap_err()));
    }
}
