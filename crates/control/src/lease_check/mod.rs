//! Which peer leases this node may act on. Every lease from any registry passes here before a
//! backend sees it, so a lease written by a buggy or hostile node can never change a route,
//! a neighbour or a userspace table entry.
//!
//! [`LeaseRules`] judges a lease on its own; what it [`Claim`]s that only one peer may have (a
//! subnet of either family, the address the dataplane knows a peer by, a WireGuard key) is
//! settled among all leases by the peers above it (`peers::Peers`): the older lease ([`by_creation`])
//! keeps it, the newer is refused with [`Rejection::Taken`].

use crate::config::Config;
use crate::host::netlink::MacAddr;
use crate::shown;
mod ipv6;
pub mod wireguard;

pub use ipv6::{overlaps_v6, unusable_ipv6, Ipv6Rules};

use crate::backend_kind::BackendKind;
use crate::lease::Lease;
use ipnet::{Ipv4Net, Ipv6Net};
use std::cmp::Ordering;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use twill_dataplane::engine::wireguard::PublicKey;

/// Why a peer lease was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// Every lease of a flannel network has the config's `SubnetLen`.
    PrefixLength {
        got: u8,
        want: u8,
    },
    OutsideNetwork(Ipv4Net),
    /// It claims (part of) this node's own subnet.
    OverlapsOwn(Ipv4Net),
    /// Its PublicIP is this node's: traffic for it would loop back to us.
    OwnPublicIp(Ipv4Addr),
    /// Its PublicIP cannot be a host (unspecified, loopback, multicast, broadcast).
    UnusablePublicIp(Ipv4Addr),
    /// Its PublicIP lies inside the container network: its datagrams would be routed into the
    /// tunnel they come out of, a loop.
    PublicIpInNetwork {
        ip: Ipv4Addr,
        network: Ipv4Net,
    },
    /// A vxlan lease whose VtepMAC is missing, malformed, zero, or multicast.
    VtepMac(String),
    /// A wireguard lease whose PublicKey is missing or malformed, or whose Port is no port, or
    /// that lacks what this node's Mode needs of it (BackendV6Data, a PublicIPv6).
    WireguardData(String),
    /// A wireguard lease with this node's own PublicKey: we cannot be our own peer.
    OwnKey(PublicKey),
    /// A lease of another backend type than this node runs (flannel's udp writes none): the
    /// two cannot carry each other's traffic, as in flanneld, which skips such leases.
    BackendType {
        got: String,
        want: String,
    },
    /// It claims what an older accepted lease, `first`, has (see [`Claim`]): of two leases
    /// that claim one subnet, one address or one key, every node keeps the older.
    Taken {
        claim: Claim,
        first: String,
    },
    /// Its IPv6 subnet's prefix length is not the config's `IPv6SubnetLen`.
    Ipv6PrefixLength {
        got: u8,
        want: u8,
    },
    OutsideIpv6Network(Ipv6Net),
    /// Its IPv6 subnet claims (part of) this node's own.
    OverlapsOwnIpv6(Ipv6Net),
    /// Its PublicIPv6 is this node's: traffic for it would loop back to us.
    OwnPublicIpv6(Ipv6Addr),
    /// Its PublicIPv6 lies inside the IPv6Network: a loop, as [`Rejection::PublicIpInNetwork`].
    PublicIpv6InNetwork {
        ip: Ipv6Addr,
        network: Ipv6Net,
    },
    /// Its PublicIPv6 cannot be another host's address; `why` says what it is instead.
    UnusablePublicIpv6 {
        ip: Ipv6Addr,
        why: &'static str,
    },
    /// It names no PublicIPv6, and this network's datagrams go over IPv6 (`Backend.Underlay`).
    NoPublicIpv6,
    /// It has an IPv4 subnet, and this network is IPv6-only (`EnableIPv4` false). A lease
    /// without one has an IPv6 subnet: [`Lease::subnets`] holds one family at least.
    Ipv4OnIpv6Only(Ipv4Net),
    /// It has no IPv4 subnet (an IPv6-only lease), and this network has IPv4.
    NoIpv4Subnet,
    /// It names no PublicIP, and this network has IPv4.
    NoPublicIp,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::PrefixLength { got, want } => {
                write!(
                    f,
                    "prefix length /{got} differs from the network's SubnetLen /{want}"
                )
            }
            Rejection::OutsideNetwork(network) => {
                write!(f, "it lies outside the network {network}")
            }
            Rejection::OverlapsOwn(own) => write!(f, "it overlaps this node's own lease {own}"),
            Rejection::OwnPublicIp(ip) => write!(f, "its PublicIP {ip} is this node's own"),
            Rejection::UnusablePublicIp(ip) => write!(f, "its PublicIP {ip} is not a host address"),
            Rejection::PublicIpInNetwork { ip, network } => write!(
                f,
                "its PublicIP {ip} lies inside the network {network}: its traffic would be sent \
                 into the tunnel it travels in, a loop"
            ),
            Rejection::VtepMac(why) | Rejection::WireguardData(why) => write!(f, "{why}"),
            Rejection::OwnKey(key) => write!(f, "its PublicKey \"{key}\" is this node's own"),
            Rejection::BackendType { got, want } => write!(
                f,
                "its backend type {} is not this node's {want}: they cannot carry each \
                 other's traffic",
                shown::value(got)
            ),
            Rejection::Taken { claim, first } => claim.taken(first, f),
            Rejection::Ipv6PrefixLength { got, want } => write!(
                f,
                "its IPv6 subnet's prefix length /{got} differs from the network's \
                 IPv6SubnetLen /{want}"
            ),
            Rejection::OutsideIpv6Network(network) => {
                write!(f, "its IPv6 subnet lies outside the IPv6Network {network}")
            }
            Rejection::OverlapsOwnIpv6(own) => {
                write!(
                    f,
                    "its IPv6 subnet overlaps this node's own IPv6 subnet {own}"
                )
            }
            Rejection::OwnPublicIpv6(ip) => write!(f, "its PublicIPv6 {ip} is this node's own"),
            Rejection::PublicIpv6InNetwork { ip, network } => write!(
                f,
                "its PublicIPv6 {ip} lies inside the IPv6Network {network}: its traffic would be \
                 sent into the tunnel it travels in, a loop"
            ),
            Rejection::UnusablePublicIpv6 { ip, why } => {
                write!(f, "its PublicIPv6 {ip} is {why}, not a host's address")
            }
            Rejection::Ipv4OnIpv6Only(subnet) => write!(
                f,
                "it has the IPv4 subnet {subnet}, and this network is IPv6-only (EnableIPv4 false)"
            ),
            Rejection::NoIpv4Subnet => write!(
                f,
                "it has no IPv4 subnet (an IPv6-only lease), and this network has IPv4"
            ),
            Rejection::NoPublicIp => write!(
                f,
                "it names no PublicIP (its PublicIP 0.0.0.0 is not a host address), and this \
                 network has IPv4"
            ),
            Rejection::NoPublicIpv6 => write!(
                f,
                "it names no PublicIPv6, and this network reaches peers over IPv6 (its \
                 Backend.Underlay is ipv6, or it is IPv6-only): there is no address to send \
                 its traffic to"
            ),
        }
    }
}

/// What every peer lease must satisfy, whatever the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRules {
    /// The rules for leases' IPv4 side; `None` on an IPv6-only network.
    pub ipv4: Option<Ipv4Rules>,
    /// This node's WireGuard key, when it runs the wireguard backend.
    pub own_key: Option<PublicKey>,
    /// This node's BackendType (`None` for flannel's udp); a peer's must be the same.
    pub backend_type: Option<Arc<str>>,
    /// The rules for leases' IPv6 side, on a dual-stack or IPv6-only node; an IPv4-only node
    /// ignores it, as flanneld does.
    pub ipv6: Option<Ipv6Rules>,
}

/// What a lease's IPv4 side must satisfy, on a network with IPv4.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv4Rules {
    pub network: Ipv4Net,
    pub subnet_len: u8,
    pub own_subnet: Ipv4Net,
    pub own_public_ip: Ipv4Addr,
}

impl Ipv4Rules {
    fn check(&self, lease: &Lease) -> Result<(), Rejection> {
        let subnet = lease.subnets.v4().ok_or(Rejection::NoIpv4Subnet)?;
        if subnet.prefix_len() != self.subnet_len {
            return Err(Rejection::PrefixLength {
                got: subnet.prefix_len(),
                want: self.subnet_len,
            });
        }
        if !self.network.contains(&subnet) {
            return Err(Rejection::OutsideNetwork(self.network));
        }
        if overlaps(subnet, self.own_subnet) {
            return Err(Rejection::OverlapsOwn(self.own_subnet));
        }
        let public_ip = lease.public_addrs.v4().ok_or(Rejection::NoPublicIp)?;
        check_public_ip(public_ip, self.own_public_ip)?;
        if self.network.contains(&public_ip) {
            return Err(Rejection::PublicIpInNetwork {
                ip: public_ip,
                network: self.network,
            });
        }
        Ok(())
    }
}

impl LeaseRules {
    pub fn new(config: &Config, own: &Lease) -> LeaseRules {
        LeaseRules {
            ipv4: config.ipv4.as_ref().zip(own.ipv4_side().ok()).map(
                |(v4, (own_subnet, own_public_ip))| Ipv4Rules {
                    network: v4.network,
                    // Every lease has the prefix length of ours: the config's SubnetLen with
                    // etcd, the controller manager's node CIDR size in Kubernetes
                    // (net-conf.json need not name it).
                    subnet_len: own_subnet.prefix_len(),
                    own_subnet,
                    own_public_ip,
                },
            ),
            own_key: wireguard_key(own),
            backend_type: own.backend_type.clone(),
            ipv6: config
                .ipv6
                .as_ref()
                .map(|v6| Ipv6Rules::new(config, v6, own)),
        }
    }

    /// The checks of one lease on its own; overlaps with other peers are checked by [`admit`].
    pub fn check(&self, lease: &Lease) -> Result<(), Rejection> {
        self.check_keyed(lease).map(drop)
    }

    /// [`LeaseRules::check`], which also gives a wireguard lease's key.
    pub fn check_keyed(&self, lease: &Lease) -> Result<Option<PublicKey>, Rejection> {
        match &self.ipv4 {
            Some(v4) => v4.check(lease)?,
            None => {
                if let Some(subnet) = lease.subnets.v4() {
                    return Err(Rejection::Ipv4OnIpv6Only(subnet));
                }
            }
        }
        if let Some(v6) = &self.ipv6 {
            v6.check(lease)?;
        }
        // flannel's udp backend writes no type; a lease that names it "udp" means the same.
        let udp = BackendKind::Udp.name();
        let name = |t: &Option<Arc<str>>| t.as_deref().unwrap_or(udp).to_string();
        let (got, want) = (name(&lease.backend_type), name(&self.backend_type));
        if got != want {
            return Err(Rejection::BackendType { got, want });
        }
        match lease.kind() {
            Some(BackendKind::Vxlan) => {
                for family in self.vtep_families(lease) {
                    vtep_mac(lease, family)?;
                }
                Ok(None)
            }
            Some(BackendKind::Wireguard) => {
                let (key, _) = lease.wireguard_data().map_err(Rejection::WireguardData)?;
                match self.own_key {
                    Some(own) if own == key => Err(Rejection::OwnKey(key)),
                    _ => Ok(Some(key)),
                }
            }
            // Their leases carry no data a peer is read by (a twill-batch lease's Port is the
            // endpoint's, claimed below).
            Some(BackendKind::Udp | BackendKind::TwillBatch | BackendKind::HostGw)
            | Some(BackendKind::Ipip)
            | None => Ok(None),
        }
    }
}

/// A wireguard lease's key, if it has a good one.
pub fn wireguard_key(lease: &Lease) -> Option<PublicKey> {
    if lease.kind() != Some(BackendKind::Wireguard) {
        return None;
    }
    lease.wireguard_data().ok().map(|(key, _)| key)
}

/// The order leases were made in: the registry's creation order, the same on every node (never
/// the order events arrived in), then, for a tie (two etcd keys made in one transaction,
/// leases with no known order), the lease's origin, which every node also agrees on.
pub fn by_creation(a: &Lease, b: &Lease) -> Ordering {
    (&a.created, a.origin()).cmp(&(&b.created, b.origin()))
}

/// Whether `a` was made before `b` ([`by_creation`]).
pub fn first_made(a: &Lease, b: &Lease) -> bool {
    by_creation(a, b) == Ordering::Less
}

/// What one lease claims: four things at most (its subnets, and an endpoint, a key or its two
/// VtepMACs), kept without an allocation.
pub type Claims = arrayvec::ArrayVec<Claim, 4>;

/// Which of a vxlan node's devices a VtepMAC belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VtepFamily {
    /// `flannel.<VNI>`, whose MAC is the lease's BackendData.VtepMAC.
    V4,
    /// `flannel-v6.<VNI>`, whose MAC is its BackendV6Data.VtepMAC.
    V6,
}

impl VtepFamily {
    /// The lease field that carries this device's MAC.
    fn field(self) -> &'static str {
        match self {
            VtepFamily::V4 => "BackendData",
            VtepFamily::V6 => "BackendV6Data",
        }
    }
}

/// Something a peer lease claims that no other peer may have. Of two leases that claim
/// overlapping subnets, one endpoint, one key or one VtepMAC, the older keeps it
/// ([`by_creation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Its IPv4 subnet: a route can lead to one peer only.
    Subnet(Ipv4Net),
    /// Its IPv6 subnet, on a node with IPv6.
    Ipv6Subnet(Ipv6Net),
    /// The address the dataplane knows the peer by, where it knows peers by address (flannel's
    /// udp, on TUN or eBPF, and twill-batch, whose engines take a datagram's sender for the
    /// peer): its PublicIP, or PublicIPv6 over an IPv6 underlay, with the Port its BackendData
    /// names (a twill-batch lease, a `--peer IP:PORT`; flanneld's udp leases name none: every
    /// node has the network's). The other backends know a peer by its subnet or key, so nodes
    /// behind one NAT may share a PublicIP there.
    Endpoint { ip: IpAddr, port: Option<u16> },
    /// A wireguard lease's PublicKey: a key names one WireGuard peer.
    Key(PublicKey),
    /// A vxlan lease's VtepMAC on one device: the kernel's fdb is keyed by MAC, so a second
    /// lease with a peer's MAC would repoint that peer's frames at its own PublicIP.
    VtepMac { family: VtepFamily, mac: MacAddr },
}

impl Claim {
    /// Whether a lease that claims `self` and one that claims `other` cannot both be peers.
    pub fn clashes(&self, other: &Claim) -> bool {
        match (self, other) {
            (Claim::Subnet(a), Claim::Subnet(b)) => overlaps(*a, *b),
            (Claim::Ipv6Subnet(a), Claim::Ipv6Subnet(b)) => overlaps_v6(*a, *b),
            (a, b) => a == b,
        }
    }

    /// The reason a lease is refused when `first` has this.
    fn taken(&self, first: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let older = "of two leases that claim one subnet, every node keeps the older";
        match self {
            Claim::Subnet(subnet) => write!(
                f,
                "it overlaps {subnet}, the subnet of the lease {first}, made before it: {older}"
            ),
            Claim::Ipv6Subnet(subnet) => write!(
                f,
                "its IPv6 subnet overlaps {subnet}, the IPv6 subnet of the lease {first}, made \
                 before it: {older}"
            ),
            Claim::Endpoint { ip, port } => {
                write!(f, "its PublicIP {ip}")?;
                if let Some(port) = port {
                    write!(f, " (port {port})")?;
                }
                write!(
                    f,
                    " is already the address of the lease {first}, made before it: this \
                     dataplane knows a peer by its address, so one address is one peer"
                )
            }
            Claim::Key(key) => write!(
                f,
                "its PublicKey \"{key}\" is already the key of the lease {first}, made before \
                 it: a WireGuard key can be only one peer"
            ),
            Claim::VtepMac { family, mac } => write!(
                f,
                "its {}.VtepMAC {mac} is already the VtepMAC of the lease {first}, made before \
                 it: the kernel's fdb sends a MAC's frames to one host",
                family.field()
            ),
        }
    }
}

impl LeaseRules {
    /// What `lease`, which passed [`LeaseRules::check_keyed`] with `key`, claims that no other
    /// peer may have on this node.
    pub fn claims(&self, lease: &Lease, key: Option<PublicKey>) -> Claims {
        let mut claims = Claims::new();
        if let Some(subnet) = lease.subnets.v4().filter(|_| self.ipv4.is_some()) {
            claims.push(Claim::Subnet(subnet));
        }
        if let Some(subnet) = lease.subnets.v6().filter(|_| self.ipv6.is_some()) {
            claims.push(Claim::Ipv6Subnet(subnet));
        }
        if let Some(endpoint) = self.endpoint(lease) {
            claims.push(endpoint);
        }
        claims.extend(key.map(Claim::Key));
        if lease.kind() == Some(BackendKind::Vxlan) {
            for family in self.vtep_families(lease) {
                if let Ok(mac) = vtep_mac(lease, family) {
                    claims.push(Claim::VtepMac { family, mac });
                }
            }
        }
        claims
    }

    /// The devices of a vxlan `lease` this node sends to, whose VtepMACs it needs: flannel.<VNI>
    /// where the network has IPv4, flannel-v6.<VNI> where this node runs IPv6 and the lease has
    /// an IPv6 subnet.
    fn vtep_families(&self, lease: &Lease) -> impl Iterator<Item = VtepFamily> {
        let v4 = self.ipv4.is_some().then_some(VtepFamily::V4);
        let v6 = (self.ipv6.is_some() && lease.subnets.v6().is_some()).then_some(VtepFamily::V6);
        v4.into_iter().chain(v6)
    }

    /// The address the dataplane knows `lease`'s node by, where it knows peers by address.
    fn endpoint(&self, lease: &Lease) -> Option<Claim> {
        if !BackendKind::of_lease(self.backend_type.as_deref()).is_some_and(BackendKind::userspace)
        {
            return None;
        }
        // The engines send to a Port the lease names (a twill-batch lease, a `--peer IP:PORT`),
        // else to the network's.
        let port = lease.backend_data.as_ref().and_then(|d| d.get("Port"));
        let port = port
            .and_then(|p| p.as_u64())
            .and_then(|p| u16::try_from(p).ok());
        let over_ipv6 =
            self.ipv4.is_some() && self.ipv6.as_ref().is_some_and(|v6| v6.needs_public_ip);
        let ip = match over_ipv6 {
            true => IpAddr::V6(lease.public_addrs.v6()?),
            false => IpAddr::V4(lease.public_addrs.v4()?),
        };
        Some(Claim::Endpoint { ip, port })
    }
}

pub(crate) fn overlaps(a: Ipv4Net, b: Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

fn check_public_ip(ip: Ipv4Addr, own: Ipv4Addr) -> Result<(), Rejection> {
    if ip == own {
        return Err(Rejection::OwnPublicIp(ip));
    }
    if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() || ip.is_broadcast() {
        return Err(Rejection::UnusablePublicIp(ip));
    }
    Ok(())
}

/// The MAC a vxlan peer's traffic goes to on `family`'s device: a zero or multicast (broadcast
/// included) MAC would leave a neighbour entry that sends the peer's subnet nowhere, or
/// everywhere.
fn vtep_mac(lease: &Lease, family: VtepFamily) -> Result<MacAddr, Rejection> {
    let data = match family {
        VtepFamily::V4 => lease.backend_data.as_ref(),
        VtepFamily::V6 => lease.backend_v6_data.as_ref(),
    };
    let mac = data.and_then(|d| d.get("VtepMAC"));
    let Some(text) = mac.as_ref().and_then(|m| m.as_str()) else {
        let field = family.field();
        return Err(Rejection::VtepMac(format!("it has no {field}.VtepMAC")));
    };
    let mac: MacAddr = text.parse().map_err(|_| {
        let text = shown::quoted(text);
        Rejection::VtepMac(format!("its VtepMAC {text} is not a MAC address"))
    })?;
    if mac.0 == [0; 6] || mac.0[0] & 1 == 1 {
        return Err(Rejection::VtepMac(format!(
            "its VtepMAC {mac} is not a unicast address"
        )));
    }
    Ok(mac)
}

#[cfg(test)]
mod tests;
