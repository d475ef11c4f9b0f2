/* The maps twill's udp programs share with userspace (crates/ebpf/src/maps.rs mirrors every
 * layout here; a change must be made in both). Addresses and ports are in network order, as
 * they sit in packets, so the programs compare them without swapping. */
#pragma once

#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

/* 60,000 leases must fit, with room to spare. */
#define MAX_PEERS 65536

/* The slots of the drop counter array are twill_dataplane::stats::DropReason's discriminants. */
enum drop_reason {
	DROP_UNKNOWN_PEER = 0,
	DROP_SPOOFED_SOURCE = 1,
	DROP_MALFORMED = 2,
	DROP_NOT_IPV4 = 3,
	DROP_NO_ROUTE = 4,
	DROP_TOO_BIG = 5,
	DROP_TTL_EXCEEDED = 6,
	DROP_IO_ERROR = 9,
	DROP_REASONS = 15,
};

/* What userspace tells the programs about this node, in slot 0. */
struct config {
	__be32 local_ip;        /* the node's underlay address: outer source, ingress filter */
	__u32 underlay_ifindex; /* where encapsulated packets leave */
	__u32 device_ifindex;   /* twill's dummy device: decapsulated packets enter here */
	__be16 port;            /* flannel's udp port: outer source and destination */
	__u16 mtu;              /* the device's MTU: a larger inner packet is too big */
	__u8 device_mac[6];     /* the dummy's MAC: a frame entering it must be addressed to it */
	__u8 pad[2];
};

struct route_key {
	__u32 prefixlen;
	__be32 addr;
};

struct route_key6 {
	__u32 prefixlen;
	__u8 addr[16];
};

/* route.flags: the peer's node takes what a veth hands it, TCP super-packets whole and
 * checksums still to be filled in (an eBPF node: its lease says "SuperPackets"). A peer
 * without it (a TUN node, flanneld, an older twill) reads datagrams from a socket, and what
 * goes to it over a veth underlay is segmented and checksummed first (the segmenter map). */
#define ROUTE_SUPER_PACKETS 1

/* A destination subnet's peer (routes6 holds the same, by IPv6 subnet). */
struct route {
	__be32 endpoint;        /* the peer's underlay address */
	__be16 port;
	__u16 flags;            /* ROUTE_* */
	__u32 slot;             /* the peer's index in peer_traffic */
};

/* A peer found by the outer source of a datagram. */
struct peer {
	__be32 subnet;
	__be32 mask;
	__be16 port;
	__u16 pad;
	__u32 slot;
};

/* A peer's IPv6 subnet, host bits zero, and its mask: an IPv6 inner packet from the peer must
 * come from inside it. */
struct subnet6 {
	__u8 addr[16];
	__u8 mask[16];
};

struct traffic {
	__u64 tx_packets;
	__u64 tx_bytes;
	__u64 rx_packets;
	__u64 rx_bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, MAX_PEERS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct route_key);
	__type(value, struct route);
} routes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PEERS);
	__type(key, __be32);
	__type(value, struct peer);
} peers SEC(".maps");

/* On a dual-stack network: the IPv6 subnets, and the IPv6 subnet of each peer by its slot
 * (whatever the underlay address it is found by). Maps of their own rather than wider entries
 * in routes and peers, so that the maps an IPv4-only build pinned are adopted as they are. A
 * peer without an IPv6 subnet has no entry: any IPv6 packet from it is spoofed, as the
 * userspace engine has it. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, MAX_PEERS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct route_key6);
	__type(value, struct route);
} routes6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PEERS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct subnet6);
} peer_subnets6 SEC(".maps");

/* On a veth underlay, slot 0 holds the ifindex of the segmenter's sending end: a veth that
 * checksums and segments in software at transmit, whose other end runs twill_segmented. Zero
 * on any other underlay, where the device (or the kernel for it) segments at transmit. A map
 * of its own, so that an older build's pinned config is adopted as it is. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} segmenter SEC(".maps");

/* An IPv6 address, as it sits in packets. */
struct addr6 {
	__u8 addr[16];
};

/* Over the IPv6 underlay (Backend.Underlay "ipv6"): the node's IPv6 underlay address in slot
 * 0, the outer source and the ingress filter; all zero over the IPv4 underlay. Then peers6
 * finds a peer by the outer IPv6 source (the same struct peer as peers), and endpoints6 holds
 * each peer's IPv6 underlay address by its slot, where egress sends what routes and routes6
 * give that slot. Maps of their own, so that the maps an IPv4-underlay build pinned are
 * adopted as they are. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct addr6);
} config6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PEERS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct addr6);
	__type(value, struct peer);
} peers6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PEERS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct addr6);
} endpoints6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_PEERS);
	__type(key, __u32);
	__type(value, struct traffic);
} peer_traffic SEC(".maps");

/* Slot 0: every peer's traffic together, kept when peers go. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct traffic);
} totals SEC(".maps");

/* A datagram to this node's port that came in fragments, by sender and IP id: its first
 * fragment was dropped, and its later fragments (which carry no UDP header to tell whose they
 * are) are dropped and counted too. */
struct fragment_key {
	__be32 saddr;
	__be16 id;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct fragment_key);
	__type(value, __u8);
} our_fragments SEC(".maps");

/* The same over the IPv6 underlay, by sender and the Fragment header's identification. */
struct fragment6_key {
	__u8 saddr[16];
	__be32 id;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct fragment6_key);
	__type(value, __u8);
} our_fragments6 SEC(".maps");

/* twill's device's own addresses, in slot 0: the lease's network address, and its IPv6 one on
 * a dual-stack network (else all zero); the source of the ICMP errors the programs answer
 * with (icmp.h), none while zero. A map of its own, so that an older build's pinned config is
 * adopted as it is. */
struct own_addrs {
	__be32 ip;
	struct addr6 ip6;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct own_addrs);
} own_addrs SEC(".maps");

/* How many ICMP errors the programs may answer with (twill_dataplane::icmp_limit: the kernel's
 * icmp_msgs_per_sec and icmp_msgs_burst), in slot 0: userspace writes the rate as the cost of
 * one answer and the burst as how far ahead of now the answers sent may have spent (GCRA, as
 * the userspace engine's governor); the programs keep when what was sent is paid for, and
 * count the answers held back. One value for every CPU, as the kernel's own limit is: two CPUs
 * answering at the same instant may let one more through, which the kernel's allows too. A
 * map of its own, so that an older build's pinned maps are adopted as they are. */
struct icmp_budget {
	__u64 interval_ns; /* the cost of one answer; 0: none is sent */
	__u64 slack_ns;    /* the burst, less one answer */
	__u64 paid_until;  /* bpf_ktime_get_ns() by which the answers sent are paid for */
	__u64 limited;     /* answers held back */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct icmp_budget);
} icmp_budget SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, DROP_REASONS);
	__type(key, __u32);
	__type(value, __u64);
} drops SEC(".maps");
