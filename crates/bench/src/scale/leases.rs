//! Synthetic leases in a real etcd, in flannel's schema.
//!
//! Their PublicIPs come from 198.18.0.0/15 (RFC 2544's benchmarking range), which no lab
//! namespace has a route to: a peer table entry, an fdb entry or a route via such an address
//! sends nothing unless traffic is routed to that subnet, and none is.

use super::ScaleBackend;
use anyhow::{ensure, Context, Result};
use etcd_client::{Client, Txn, TxnOp};
use futures::{stream, StreamExt, TryStreamExt};
use std::net::Ipv4Addr;
use tokio::runtime::Runtime;
use twill_lab::Ipv4Net;

pub const PREFIX: &str = "/coreos.com/network";
/// 65,536 subnets of /24: the whole of flannel's default-sized address space.
pub const NETWORK: &str = "10.0.0.0/8";
/// The range the synthetic PublicIPs come from; no route to it may exist in the lab.
pub const UNROUTED: &str = "198.18.0.0/15";
/// etcd's default limit of operations in one transaction.
const TXN_OPS: usize = 128;
const TXNS_IN_FLIGHT: usize = 8;

/// Which synthetic lease: the `i`-th filler, or the `i`-th probe whose arrival is timed. Fillers
/// take the lowest subnets (so a joining node looks past all of them for a free one), probes the
/// top /16s, far from where the node under test takes its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synthetic {
    Filler(u32),
    Probe(u32),
}

/// flannel's etcd key of the lease on `subnet`.
pub fn lease_key(subnet: Ipv4Net) -> String {
    let subnet = subnet.trunc();
    format!(
        "{PREFIX}/subnets/{}-{}",
        subnet.network(),
        subnet.prefix_len()
    )
}

impl Synthetic {
    pub fn subnet(self) -> Ipv4Net {
        let network = match self {
            Synthetic::Filler(i) => u32::from(Ipv4Addr::new(10, 0, 1, 0)) + (i << 8),
            Synthetic::Probe(i) => u32::from(Ipv4Addr::new(10, 254, 0, 0)) + (i << 8),
        };
        Ipv4Net::new(network.into(), 24).expect("/24")
    }

    pub fn public_ip(self) -> Ipv4Addr {
        let base = u32::from(Ipv4Addr::new(198, 18, 0, 1));
        match self {
            Synthetic::Filler(i) => (base + i).into(),
            Synthetic::Probe(i) => (base + 0x1_0000 + 0x8000 + i).into(),
        }
    }

    /// A unicast, locally administered VtepMAC, unique per lease.
    pub fn vtep_mac(self) -> String {
        let (kind, i) = match self {
            Synthetic::Filler(i) => (0, i),
            Synthetic::Probe(i) => (1, i),
        };
        let [a, b, c, d] = i.to_be_bytes();
        format!("0e:{kind:02x}:{a:02x}:{b:02x}:{c:02x}:{d:02x}")
    }

    pub fn key(self) -> String {
        lease_key(self.subnet())
    }

    /// The lease JSON a node of `backend` writes, flannel's field order.
    pub fn value(self, backend: ScaleBackend) -> String {
        let ip = self.public_ip();
        match backend {
            ScaleBackend::Udp | ScaleBackend::Ebpf => {
                format!(r#"{{"PublicIP":"{ip}","PublicIPv6":null}}"#)
            }
            ScaleBackend::Vxlan => format!(
                r#"{{"PublicIP":"{ip}","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"{}"}}}}"#,
                self.vtep_mac()
            ),
            ScaleBackend::HostGw => {
                format!(r#"{{"PublicIP":"{ip}","PublicIPv6":null,"BackendType":"host-gw"}}"#)
            }
        }
    }
}

/// The network config for `backend`.
pub fn config(backend: ScaleBackend) -> String {
    format!(
        r#"{{"Network":"{NETWORK}","SubnetLen":24,"Backend":{{"Type":"{}"}}}}"#,
        backend.backend_type()
    )
}

/// An etcd client for the bench's own writes. Built inside the lab host's namespace, where
/// etcd listens on loopback.
pub struct Writer {
    runtime: Runtime,
    client: Client,
}

impl Writer {
    pub fn connect(endpoint: &str) -> Result<Writer> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let client = runtime
            .block_on(Client::connect([endpoint], None))
            .with_context(|| format!("connect to etcd at {endpoint}"))?;
        Ok(Writer { runtime, client })
    }

    /// Writes the config and fillers `0..count` for `backend`, in transactions of 128 puts.
    pub fn fill(&self, backend: ScaleBackend, count: u32) -> Result<()> {
        let kv = self.client.kv_client();
        let mut put_config = kv.clone();
        let txns = (0..count).collect::<Vec<_>>();
        let txns = txns.chunks(TXN_OPS).map(|chunk| {
            let puts = chunk.iter().map(|&i| {
                let lease = Synthetic::Filler(i);
                TxnOp::put(lease.key(), lease.value(backend), None)
            });
            let mut kv = kv.clone();
            let txn = Txn::new().and_then(puts.collect::<Vec<_>>());
            async move { kv.txn(txn).await }
        });
        self.runtime.block_on(async {
            put_config
                .put(format!("{PREFIX}/config"), config(backend), None)
                .await?;
            stream::iter(txns)
                .buffer_unordered(TXNS_IN_FLIGHT)
                .try_for_each(|_| async { Ok(()) })
                .await
        })?;
        Ok(())
    }

    pub fn put(&self, lease: Synthetic, backend: ScaleBackend) -> Result<()> {
        let mut kv = self.client.kv_client();
        self.runtime
            .block_on(kv.put(lease.key(), lease.value(backend), None))?;
        Ok(())
    }

    pub fn delete(&self, key: &str) -> Result<()> {
        let mut kv = self.client.kv_client();
        let deleted = self.runtime.block_on(kv.delete(key, None))?;
        ensure!(deleted.deleted() == 1, "etcd had no key {key}");
        Ok(())
    }
}
