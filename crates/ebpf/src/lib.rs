//! twill's in-kernel dataplane for flannel's udp wire (UDP port 8285 by default, the payload
//! the bare inner IPv4 or IPv6 packet, over the IPv4 underlay): two TC eBPF programs and an XDP
//! one, written in C (bpf/udp.bpf.c) and built by build.rs on every build, with the same rules
//! as the userspace udp engine.
//!
//! - `twill_egress`, at the egress of twill's dummy device (the flannel network is routed to
//!   it): finds the destination's peer in an LPM map of its family, decrements the TTL or hop
//!   limit, encapsulates and sends the datagram out of the underlay (`bpf_redirect_neigh`).
//! - `twill_ingress`, at the underlay's ingress: takes only UDP to the node's address and
//!   port, checks the sender is a peer, the inner packet well-formed and from inside that
//!   peer's subnet of its family, decapsulates it and hands it to the stack as if it came in on
//!   the dummy.
//!
//! - `twill_xdp_ingress`, on the underlay in the driver's native XDP mode where it takes one:
//!   the same checks on each wire frame before GRO, so the inner TCP is coalesced; it passes
//!   the decapsulated frame up with a mark, and `twill_ingress` moves it into the device.
//!
//! They attach by tcx links (Linux 6.6+) or classic TC filters, a clsact qdisc and a
//! direct-action bpf filter ([`AttachMode`], `--bpf-attach`). Programs, links and maps are
//! pinned under a directory per device (a classic filter outlives the daemon by itself), so
//! they outlive the daemon: [`Dataplane::open`] adopts them on the next start, [`remove`] takes them away.

mod attach;
mod batch;
mod cleanup;
mod counters;
mod dataplane;
mod device;
mod filters;
mod loaded;
mod maps;
mod object;
mod peers;
mod pinned;
mod pins;
mod probe;
mod segmenter;
mod wire;
mod xdp;

pub use attach::{AttachMode, Hook};
pub use cleanup::{remove, remove_anyway};
pub use counters::{Counters, PeerTraffic, Traffic};
pub use dataplane::{Attachment, Dataplane, Opened};
pub use device::checksums_in_software;
pub use loaded::{TestOutput, Verdict};
pub use maps::MAX_PEERS;
pub use object::Side;
pub use peers::Takes;
pub use pinned::PinnedPeers;
pub use pins::can_pin;
pub use probe::{probe, probe_xdp, Unsupported};
pub use segmenter::Segmenter;
pub use wire::{veth_under, VethUnder};
pub use xdp::{Ingress, XdpChoice};
