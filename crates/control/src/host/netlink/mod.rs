//! A thin layer over rtnetlink for the kernel backends: links, addresses, routes, neighbours and
//! VXLAN fdb entries, of both address families, as flanneld programs them.
//!
//! Every call returns `io::Result` with the kernel's errno intact, so callers can tell "already
//! there" or "module missing" apart from real failures. Adds use replace semantics and deletes of
//! something already gone succeed, which keeps every operation idempotent.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use futures::{Stream, TryStreamExt};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::link::LinkMessage;
use netlink_packet_route::neighbour::NeighbourMessage;
use netlink_packet_route::route::RouteMessage;
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::proto::ConnectionHandle;
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};

mod blackhole;
mod dump;
mod lookup;
mod message;
mod nexthop;
mod nexthop_list;
mod state;
mod watch;
mod write;
pub use lookup::{HostAddress, RouteTo};
pub(crate) use message::parse_link;
use message::*;
pub use message::{ipip_link_message, route_message, vxlan_link_message};
use nexthop::RtnlMessage;
pub use state::*;
pub use watch::{Groups, Notice, Watch};
pub use write::{Write, NEXTHOP_PROTOCOL};

/// Connections to the kernel's routing netlink, serviced by tasks on the current tokio runtime:
/// one for reads and device set-up, one that sends per-peer changes in batches ([`Write`]).
#[derive(Clone)]
pub struct Netlink {
    handle: Handle,
    batches: ConnectionHandle<RtnlMessage>,
    /// Requests that change kernel state, for status: an idle reconcile must make none.
    writes: Arc<AtomicU64>,
}

impl Netlink {
    /// Connects in the network namespace of the calling thread. Needs a tokio runtime.
    pub fn connect() -> io::Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        let (connection, handle, _) = rtnetlink::new_connection()?;
        runtime.spawn(connection);
        Ok(Netlink {
            handle,
            batches: write::connect(&runtime)?,
            writes: Arc::default(),
        })
    }

    /// Requests sent so far that change kernel state.
    pub fn writes(&self) -> u64 {
        self.writes.load(Relaxed)
    }

    fn wrote(&self) {
        self.writes.fetch_add(1, Relaxed);
    }

    pub async fn link_by_name(&self, name: &str) -> io::Result<Option<Link>> {
        let found = self
            .handle
            .link()
            .get()
            .match_name(name)
            .execute()
            .try_next()
            .await;
        match found.map_err(io_error) {
            Ok(msg) => Ok(msg.map(parse_link)),
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every link of this namespace.
    pub async fn links(&self) -> io::Result<Vec<Link>> {
        let msgs = collect(self.handle.link().get().execute()).await?;
        Ok(msgs.into_iter().map(parse_link).collect())
    }

    /// The link `name` that was just created; one that is already gone again is an error.
    pub async fn created_link(&self, name: &str) -> io::Result<Link> {
        let link = self.link_by_name(name).await?;
        link.ok_or_else(|| io::Error::other(format!("{name} vanished right after creation")))
    }

    /// Fails with the kernel's errno, e.g. EEXIST or EOPNOTSUPP (no such link type).
    pub async fn create_link(&self, msg: LinkMessage) -> io::Result<()> {
        self.wrote();
        self.handle
            .link()
            .add(msg)
            .execute()
            .await
            .map_err(io_error)
    }

    pub async fn delete_link(&self, index: u32) -> io::Result<()> {
        self.wrote();
        let deleted = self.handle.link().del(index).execute().await;
        tolerate(deleted.map_err(io_error), &[libc::ENODEV])
    }

    pub async fn set_up(&self, index: u32) -> io::Result<()> {
        self.change_link(LinkUnspec::new_with_index(index).up().build())
            .await
    }

    pub async fn set_mtu(&self, index: u32, mtu: u32) -> io::Result<()> {
        self.change_link(LinkUnspec::new_with_index(index).mtu(mtu).build())
            .await
    }

    async fn change_link(&self, msg: LinkMessage) -> io::Result<()> {
        self.wrote();
        self.handle
            .link()
            .change(msg)
            .execute()
            .await
            .map_err(io_error)
    }

    pub async fn ipv4_addresses(&self, index: u32) -> io::Result<Vec<Ipv4Net>> {
        let msgs = self.address_messages(index).await?;
        Ok(msgs.iter().filter_map(address_of).collect())
    }

    pub async fn ipv6_addresses(&self, index: u32) -> io::Result<Vec<Ipv6Net>> {
        let msgs = self.address_messages(index).await?;
        Ok(msgs.iter().filter_map(ipv6_address_of).collect())
    }

    /// Adds `addr`; an IPv6 one without duplicate address detection (`nodad`), as a tunnel
    /// device's own /128 is unique by construction and must be usable at once.
    pub async fn add_address(&self, index: u32, addr: IpNet) -> io::Result<()> {
        self.wrote();
        let mut req = self
            .handle
            .address()
            .add(index, addr.addr(), addr.prefix_len());
        if addr.addr().is_ipv6() {
            req.message_mut().attributes.push(AddressAttribute::Flags(
                AddressFlags::Nodad | AddressFlags::Permanent,
            ));
        }
        req.replace().execute().await.map_err(io_error)
    }

    pub async fn delete_address(&self, index: u32, addr: IpNet) -> io::Result<()> {
        let msgs = self.address_messages(index).await?;
        let of = |m: &AddressMessage| match addr {
            IpNet::V4(_) => address_of(m).map(IpNet::V4),
            IpNet::V6(_) => ipv6_address_of(m).map(IpNet::V6),
        };
        for msg in msgs.into_iter().filter(|m| of(m) == Some(addr)) {
            self.wrote();
            let deleted = self.handle.address().del(msg).execute().await;
            tolerate(deleted.map_err(io_error), &[libc::EADDRNOTAVAIL])?;
        }
        Ok(())
    }

    async fn address_messages(&self, index: u32) -> io::Result<Vec<AddressMessage>> {
        let req = self.handle.address().get().set_link_index_filter(index);
        collect(req.execute()).await
    }

    /// Unicast routes of the main table, IPv4 and IPv6, installed as proto boot: the netlink
    /// default that flanneld and twill write. Kernel, DHCP and routing-daemon routes never show
    /// up here, so a backend cleaning up cannot touch them.
    pub async fn boot_routes(&self) -> io::Result<Vec<Route>> {
        let v4 = RouteMessageBuilder::<Ipv4Addr>::new().build();
        let mut routes = dump_routes(v4, parse_boot_route).await?;
        let v6 = RouteMessageBuilder::<Ipv6Addr>::new().build();
        routes.extend(dump_routes(v6, parse_boot_route).await?);
        Ok(routes)
    }

    /// Permanent neighbour entries on `index`, ARP and NDP.
    pub async fn permanent_neighbours(&self, index: u32) -> io::Result<Vec<Neighbour>> {
        let mut found = self
            .neighbours_on(AddressFamily::Inet, index, parse_neighbour)
            .await?;
        let v6 = self.neighbours_on(AddressFamily::Inet6, index, parse_neighbour);
        found.extend(v6.await?);
        Ok(found)
    }

    /// Permanent fdb entries with a destination address on `index` (`bridge fdb show dev`).
    pub async fn fdb(&self, index: u32) -> io::Result<Vec<FdbEntry>> {
        self.neighbours_on(AddressFamily::Bridge, index, parse_fdb)
            .await
    }

    async fn neighbours_on<T>(
        &self,
        family: AddressFamily,
        index: u32,
        parse: impl Fn(&NeighbourMessage) -> Option<T>,
    ) -> io::Result<Vec<T>> {
        let mut request = NeighbourMessage::default();
        request.header.family = family;
        let request = RouteNetlinkMessage::GetNeighbour(request);
        dump::dump(request, |answer| match answer {
            RtnlMessage::Route(RouteNetlinkMessage::NewNeighbour(m))
                if m.header.ifindex == index =>
            {
                parse(&m)
            }
            _ => None,
        })
        .await
    }
}

fn io_error(e: rtnetlink::Error) -> io::Error {
    match e {
        rtnetlink::Error::NetlinkError(msg) => msg.to_io(),
        other => io::Error::other(other),
    }
}

/// Treats the listed errnos as success: the state is already what the caller wanted.
fn tolerate(result: io::Result<()>, errnos: &[i32]) -> io::Result<()> {
    match result {
        Err(e) if e.raw_os_error().is_some_and(|code| errnos.contains(&code)) => Ok(()),
        other => other,
    }
}

async fn collect<T>(stream: impl Stream<Item = Result<T, rtnetlink::Error>>) -> io::Result<Vec<T>> {
    stream.try_collect().await.map_err(io_error)
}

/// Every route of one family (`request`, without a destination), as `parse` keeps them.
async fn dump_routes<T>(
    request: RouteMessage,
    parse: impl Fn(&RouteMessage) -> Option<T>,
) -> io::Result<Vec<T>> {
    dump::dump(
        RouteNetlinkMessage::GetRoute(request),
        |answer| match answer {
            RtnlMessage::Route(RouteNetlinkMessage::NewRoute(m)) => parse(&m),
            _ => None,
        },
    )
    .await
}

/// The answers to a request that is not a dump, parsed as they arrive.
async fn parse_each<M, T>(
    stream: impl Stream<Item = Result<M, rtnetlink::Error>>,
    parse: impl Fn(&M) -> Option<T>,
) -> io::Result<Vec<T>> {
    let mut stream = std::pin::pin!(stream);
    let mut parsed = Vec::new();
    while let Some(msg) = stream.try_next().await.map_err(io_error)? {
        parsed.extend(parse(&msg));
    }
    Ok(parsed)
}
