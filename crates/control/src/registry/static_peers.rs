//! A registry without etcd: every lease is given up front (`--subnet`, `--peer CIDR=IP[:PORT]`).
//! Meant for two or three hosts and for tests, where running etcd is not worth it.

use super::{Registry, EVENT_QUEUE};
use crate::backend_kind::BackendKind;
use crate::config::Config;
use crate::lease::{Created, Lease, LeaseAttrs, PublicAddrs, Subnets};
use crate::lease::{LeaseEvent, LeaseNamer};
use crate::lease_check::LeaseRules;
use crate::peers::Peers;
use anyhow::{bail, Context};
use ipnet::Ipv4Net;
use std::net::Ipv4Addr;
use std::sync::Arc;
use tokio::sync::mpsc;
use twill_dataplane::wire::batch;

/// Leases that never change: ours and the peers', all known at start.
#[derive(Debug, Clone)]
pub struct StaticRegistry {
    config: Config,
    subnet: Ipv4Net,
    peers: Vec<Arc<Lease>>,
}

impl StaticRegistry {
    /// `subnet` is this node's own; `peers` typically come from [`parse_peer`]. Refuses subnets
    /// outside the network or claimed twice, which would otherwise surface as silent misrouting.
    /// Every lease here has the prefix length of `subnet`, which becomes the config's SubnetLen.
    pub fn new(mut config: Config, subnet: Ipv4Net, peers: Vec<Lease>) -> anyhow::Result<Self> {
        if subnet.trunc() != subnet {
            bail!(
                "--subnet {subnet} has host bits set; the subnet is {}",
                subnet.trunc()
            );
        }
        let network = config.need_ipv4("--network with --peer flags")?.network;
        if let Some(v4) = config.ipv4.as_mut() {
            v4.subnet_len = subnet.prefix_len();
        }
        let mut seen = vec![subnet];
        for peer in &peers {
            let (peer_subnet, _) = peer.ipv4_side()?;
            if seen
                .iter()
                .any(|s| s.contains(&peer_subnet) || peer_subnet.contains(s))
            {
                bail!("peer subnet {peer_subnet} overlaps another subnet");
            }
            seen.push(peer_subnet);
        }
        if let Some(s) = seen.iter().find(|s| !network.contains(*s)) {
            bail!("subnet {s} is outside the network {network}");
        }
        // The flags' order is the creation order: it settles which of two leases is a peer.
        let peers = (1..)
            .zip(peers)
            .map(|(i, p)| Arc::new(p.with_created(Created::at(i))));
        Ok(StaticRegistry {
            config,
            subnet,
            peers: peers.collect(),
        })
    }
}

impl Registry for StaticRegistry {
    fn config(&self) -> &Config {
        &self.config
    }

    fn name(&self) -> String {
        "static (--peer flags)".into()
    }

    /// Refuses, in one line naming the flag, a peer that the lease checks would refuse: with
    /// flags, a mistake is better caught at start than ignored with a warning.
    async fn start(self, attrs: LeaseAttrs) -> anyhow::Result<(Lease, mpsc::Receiver<LeaseEvent>)> {
        let own = Lease::new(self.subnet, attrs);
        let mut gate = Peers::new(LeaseRules::new(&self.config, &own), LeaseNamer::Flag);
        gate.admit(LeaseEvent::Snapshot(self.peers.clone()));
        if let Some(refused) = gate.refused().next() {
            let peer = &refused.lease;
            bail!(
                "--peer {}={}: {}",
                peer.id(),
                peer.public_addrs,
                refused.reason
            );
        }
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        tx.try_send(LeaseEvent::Snapshot(self.peers))
            .expect("a new channel has room");
        // Nothing will ever change, but a closed channel would tell the consumer the registry
        // died, so the sender lives until the consumer goes away.
        tokio::spawn(async move { tx.closed().await });
        Ok((own, rx))
    }
}

/// Parses `--peer CIDR=IP[:PORT]` into a peer lease of the configured backend type.
///
/// The port, when given, goes into `BackendData` as `{"Port":N}` (how twill-batch leases carry
/// theirs), because a lease has no other place for it; without it the config's port applies.
/// A static twill-batch peer is taken to read the batch versions this build reads, as its
/// lease would say.
pub fn parse_peer(spec: &str, config: &Config) -> anyhow::Result<Lease> {
    let bad = || {
        format!("invalid --peer {spec:?}: expected CIDR=IP[:PORT], e.g. 10.5.2.0/24=192.0.2.2:8285")
    };
    let (cidr, addr) = spec.split_once('=').with_context(bad)?;
    let subnet: Ipv4Net = cidr.trim().parse().with_context(bad)?;
    if subnet.trunc() != subnet {
        bail!("invalid --peer {spec:?}: {subnet} has host bits set");
    }
    let (ip, port) = match addr.trim().split_once(':') {
        Some((ip, port)) => {
            let port = port.parse::<u16>().ok().filter(|&p| p != 0);
            (ip, Some(port.with_context(bad)?))
        }
        None => (addr.trim(), None),
    };
    let public_ip: Ipv4Addr = ip.parse().with_context(bad)?;
    let mut backend_data = serde_json::Map::new();
    if let Some(port) = port {
        backend_data.insert("Port".into(), port.into());
    }
    if config.backend.kind() == Some(BackendKind::TwillBatch) {
        backend_data.insert("Version".into(), batch::HIGHEST_VERSION.into());
    }
    Ok(Lease {
        subnets: Subnets::V4(subnet),
        public_addrs: PublicAddrs::V4(public_ip),
        backend_type: config.backend.lease_type().map(Into::into),
        backend_data: (!backend_data.is_empty())
            .then(|| serde_json::Value::from(backend_data).into()),
        backend_v6_data: None,
        created: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(backend: &str) -> Config {
        Config::for_network("10.5.0.0/16".parse().unwrap(), backend).unwrap()
    }

    #[test]
    fn parses_peers() {
        let p = parse_peer("10.5.2.0/24=192.0.2.2", &config("udp")).unwrap();
        assert_eq!(p.subnets.v4(), Some("10.5.2.0/24".parse().unwrap()));
        assert_eq!(
            p.public_addrs.v4(),
            Some("192.0.2.2".parse::<Ipv4Addr>().unwrap())
        );
        assert_eq!((p.backend_type, p.backend_data), (None, None));
        let p = parse_peer("10.5.3.0/24=192.0.2.3:9000", &config("twill-batch")).unwrap();
        assert_eq!(p.backend_type.as_deref(), Some("twill-batch"));
        let data = p.backend_data.unwrap();
        let field = |name: &str| data.get(name).and_then(|v| v.as_u64());
        assert_eq!((field("Port"), field("Version")), (Some(9000), Some(2)));
    }

    #[test]
    fn bad_peers_are_refused_with_the_spec() {
        for spec in [
            "10.5.2.0/24",
            "10.5.2.0=1.2.3.4",
            "10.5.2.1/24=1.2.3.4",
            "10.5.2.0/24=x",
            "10.5.2.0/24=1.2.3.4:99999",
            "10.5.2.0/24=1.2.3.4:0",
        ] {
            let err = parse_peer(spec, &config("udp")).unwrap_err().to_string();
            assert!(err.contains(spec), "{err}");
        }
    }

    #[tokio::test]
    async fn start_yields_the_peers_then_stays_open() {
        let cfg = config("udp");
        let peer = parse_peer("10.5.2.0/24=192.0.2.2", &cfg).unwrap();
        let reg =
            StaticRegistry::new(cfg, "10.5.1.0/24".parse().unwrap(), vec![peer.clone()]).unwrap();
        let attrs = LeaseAttrs::udp("192.0.2.1".parse::<Ipv4Addr>().unwrap());
        let (own, mut rx) = reg.start(attrs.clone()).await.unwrap();
        assert_eq!(
            own,
            Lease::new("10.5.1.0/24".parse::<Ipv4Net>().unwrap(), attrs)
        );
        assert_eq!(
            rx.recv().await,
            Some(LeaseEvent::Snapshot(vec![peer.into()]))
        );
        let next = tokio::time::timeout(std::time::Duration::from_millis(100), rx.recv()).await;
        assert!(
            next.is_err(),
            "expected no further events and an open channel, got {next:?}"
        );
    }

    #[tokio::test]
    async fn a_peer_at_our_own_public_ip_is_refused_at_start() {
        let cfg = config("udp");
        let peer = parse_peer("10.5.2.0/24=192.0.2.1", &cfg).unwrap();
        let reg = StaticRegistry::new(cfg, "10.5.1.0/24".parse().unwrap(), vec![peer]).unwrap();
        let err = reg
            .start(LeaseAttrs::udp("192.0.2.1".parse::<Ipv4Addr>().unwrap()))
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "--peer 10.5.2.0/24=192.0.2.1: its PublicIP 192.0.2.1 is this node's own"
        );
    }

    #[test]
    fn a_subnet_with_host_bits_is_refused() {
        let err = StaticRegistry::new(config("udp"), "10.5.1.7/24".parse().unwrap(), vec![])
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "--subnet 10.5.1.7/24 has host bits set; the subnet is 10.5.1.0/24"
        );
    }

    #[test]
    fn overlapping_or_foreign_subnets_are_refused() {
        let cfg = config("udp");
        let own: Ipv4Net = "10.5.1.0/24".parse().unwrap();
        let dup = parse_peer("10.5.1.0/24=192.0.2.2", &cfg).unwrap();
        assert!(StaticRegistry::new(cfg.clone(), own, vec![dup]).is_err());
        let outside = parse_peer("10.9.1.0/24=192.0.2.2", &cfg).unwrap();
        let err = StaticRegistry::new(cfg, own, vec![outside])
            .unwrap_err()
            .to_string();
        assert!(err.contains("outside the network"), "{err}");
    }
}
