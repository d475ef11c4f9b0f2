/* Which underlay frames are flannel datagrams for this node, and whether to carry them: the
 * checks both ingress programs make (twill_xdp_ingress on the wire frame, twill_ingress at TC
 * when XDP is not there), on the frame's bytes, as twill_dataplane's accept_inbound checks.
 * Parsing only: what to do with the verdict is each program's. */
#pragma once

#include "packet.h"

/* The frame is not a datagram to this node's address and port: it goes on untouched. */
#define NOT_OURS (-1)
/* Ours, from a peer, the inner packet checked: decapsulate it. */
#define CARRY (-2)
/* Ours, from a peer, and a GSO train of its datagrams (a TUN node sends with UDP_SEGMENT, and
 * a veth hands the train over whole): each is checked once the segmenter has made datagrams
 * of them. */
#define TRAIN (-3)

/* The bytes the checks read at most: Ethernet, the outer IPv6 and UDP headers and an inner IPv6
 * header (14 + 48 + 40; an outer IPv4 header with the most options and its UDP header are fewer,
 * and the inner header is read only after an optionless one). */
#define CHECKED_BYTES (ETH_HLEN + OVERHEAD6 + sizeof(struct ipv6hdr))

/* A datagram to be carried. */
struct datagram {
	struct peer *peer;
	void *inner;   /* its IPv4 or IPv6 header */
	__u32 len;     /* the inner packet's */
	__u8 family;   /* 4 or 6 */
	__u32 overhead; /* the outer headers' bytes */
};

/* The checks of an inner IPv4 packet of `len` bytes from `peer`. */
static __always_inline int check_inner4(struct iphdr *inner, void *end, __u32 len,
					const struct peer *peer, int super, const struct config *cfg)
{
	if ((void *)(inner + 1) > end)
		return DROP_MALFORMED;
	/* A super-packet of one inner packet fills the datagram; a train's first is shorter. */
	if (super && bpf_ntohs(inner->tot_len) < len)
		return TRAIN;
	if (inner->ihl < 5 || bpf_ntohs(inner->tot_len) != len || len < inner->ihl * 4U)
		return DROP_MALFORMED;
	if ((inner->saddr & peer->mask) != peer->subnet)
		return DROP_SPOOFED_SOURCE;
	/* A super-packet is larger by design; the stack checks its segments when it forwards. */
	if (!super && len > cfg->mtu)
		return DROP_TOO_BIG;
	if (inner->ttl <= 1)
		return DROP_TTL_EXCEEDED;
	return CARRY;
}

/* The same of an inner IPv6 packet: from inside the IPv6 subnet of `peer` (a peer without one
 * sends no IPv6 of its own), with hop limit left. */
static __always_inline int check_inner6(struct ipv6hdr *inner, void *end, __u32 len,
					const struct peer *peer, int super, const struct config *cfg)
{
	if ((void *)(inner + 1) > end)
		return DROP_MALFORMED;
	if (super && bpf_ntohs(inner->payload_len) + sizeof(struct ipv6hdr) < len)
		return TRAIN;
	if (jumbogram(inner) || bpf_ntohs(inner->payload_len) + sizeof(struct ipv6hdr) != len)
		return DROP_MALFORMED;
	__u32 slot = peer->slot;
	struct subnet6 *subnet = bpf_map_lookup_elem(&peer_subnets6, &slot);
	if (!subnet || !in_subnet6(&inner->saddr, subnet))
		return DROP_SPOOFED_SOURCE;
	if (!super && len > cfg->mtu)
		return DROP_TOO_BIG;
	if (inner->hop_limit <= 1)
		return DROP_TTL_EXCEEDED;
	return CARRY;
}

/* What the outer headers say of a datagram that is ours: its peer, and its inner packet. */
struct outer {
	struct peer *peer;
	void *inner;
	__u32 len;
	__u32 overhead; /* the outer headers' bytes: OVERHEAD or OVERHEAD6 */
};

/* The outer IPv4 and UDP headers: NOT_OURS, CARRY (with `o` filled in) or the drop reason. */
static __always_inline int check_outer4(void *data, void *end, __u32 frame_len,
					struct config *cfg, struct outer *o)
{
	struct iphdr *outer = data + ETH_HLEN;
	if ((void *)(outer + 1) > end)
		return NOT_OURS;
	if (outer->version != 4 || outer->protocol != IPPROTO_UDP || outer->daddr != cfg->local_ip)
		return NOT_OURS;
	struct fragment_key fragment = { .saddr = outer->saddr, .id = outer->id };
	/* A later fragment has no UDP header to tell whose it is: ours if its first was. */
	if (outer->frag_off & bpf_htons(IP_OFFSET)) {
		if (bpf_map_lookup_elem(&our_fragments, &fragment))
			return DROP_MALFORMED;
		return NOT_OURS;
	}
	/* IP options come before the UDP header; its port says whether the datagram is ours. */
	__u32 header = (outer->ihl & 0x0f) * 4;
	if (header < sizeof(struct iphdr))
		return NOT_OURS;
	struct udphdr *udp = data + ETH_HLEN + header;
	if ((void *)(udp + 1) > end || udp->dest != cfg->port)
		return NOT_OURS;

	/* Ours. flannel's peers send no IP options, and with DF: a first fragment is a datagram
	 * this node cannot check whole, and its later fragments go with it. */
	if (header != sizeof(struct iphdr))
		return DROP_MALFORMED;
	if (outer->frag_off & bpf_htons(IP_MF)) {
		__u8 seen = 1;
		bpf_map_update_elem(&our_fragments, &fragment, &seen, BPF_ANY);
		return DROP_MALFORMED;
	}
	struct peer *peer = bpf_map_lookup_elem(&peers, &outer->saddr);
	if (!peer || peer->port != udp->source)
		return DROP_UNKNOWN_PEER;
	__u32 outer_len = bpf_ntohs(outer->tot_len);
	if (outer_len < OVERHEAD + sizeof(struct iphdr) || outer_len > frame_len - ETH_HLEN ||
	    bpf_ntohs(udp->len) != outer_len - sizeof(struct iphdr))
		return DROP_MALFORMED;
	o->peer = peer;
	o->inner = data + ETH_HLEN + OVERHEAD;
	o->len = outer_len - OVERHEAD;
	o->overhead = OVERHEAD;
	return CARRY;
}

/* An IPv6 Fragment header (RFC 8200 4.5; the kernel's struct frag_hdr is not UAPI). */
struct fragment6 {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off; /* the offset in 8-byte units, then 2 reserved bits and M */
	__be32 id;
};
#define IP6_OFFSET 0xfff8
#define IP6_MF 0x0001

/* A Fragment header right after the IPv6 header of a datagram to this node, as over IPv4: a
 * first fragment to the port is ours, and counted malformed (flannel's peers fit their
 * datagrams to the path, and this node cannot check one in pieces), remembered by sender and
 * id so that its later fragments are too; any other fragment is not ours. An atomic fragment
 * (offset 0, no more to come) to the port is not flannel's wire either. */
static __always_inline int check_fragment6(struct ipv6hdr *outer, void *end, struct config *cfg)
{
	struct fragment6 *fragment = (void *)(outer + 1);
	if ((void *)(fragment + 1) > end)
		return NOT_OURS;
	struct fragment6_key key = { .id = fragment->id };
	__builtin_memcpy(key.saddr, &outer->saddr, sizeof(key.saddr));
	if (fragment->frag_off & bpf_htons(IP6_OFFSET)) {
		if (bpf_map_lookup_elem(&our_fragments6, &key))
			return DROP_MALFORMED;
		return NOT_OURS;
	}
	struct udphdr *udp = (void *)(fragment + 1);
	if (fragment->nexthdr != IPPROTO_UDP || (void *)(udp + 1) > end || udp->dest != cfg->port)
		return NOT_OURS;
	if (fragment->frag_off & bpf_htons(IP6_MF)) {
		__u8 seen = 1;
		bpf_map_update_elem(&our_fragments6, &key, &seen, BPF_ANY);
	}
	return DROP_MALFORMED;
}

/* The outer IPv6 and UDP headers, over the IPv6 underlay: the same. The UDP checksum is not
 * read, and may be zero (RFC 6935/6936): the inner packet has its own. A fragment is judged
 * by check_fragment6; any other header chain (extension headers before UDP) is not flannel's
 * wire, and the stack judges it (to the port: the node's socket there counts it). */
static __always_inline int check_outer6(void *data, void *end, __u32 frame_len,
					struct config *cfg, struct outer *o)
{
	struct ipv6hdr *outer = data + ETH_HLEN;
	if ((void *)(outer + 1) > end)
		return NOT_OURS;
	struct addr6 *local = node_config6();
	if (!local || outer->version != 6 || !same_addr6(&outer->daddr, local))
		return NOT_OURS;
	if (outer->nexthdr == IPPROTO_FRAGMENT)
		return check_fragment6(outer, end, cfg);
	struct udphdr *udp = (void *)(outer + 1);
	if (outer->nexthdr != IPPROTO_UDP || (void *)(udp + 1) > end || udp->dest != cfg->port)
		return NOT_OURS;
	struct peer *peer = bpf_map_lookup_elem(&peers6, &outer->saddr);
	if (!peer || peer->port != udp->source)
		return DROP_UNKNOWN_PEER;
	__u32 payload = bpf_ntohs(outer->payload_len);
	if (payload < sizeof(struct udphdr) + sizeof(struct iphdr) ||
	    payload > frame_len - ETH_HLEN - sizeof(struct ipv6hdr) || bpf_ntohs(udp->len) != payload)
		return DROP_MALFORMED;
	o->peer = peer;
	o->inner = udp + 1;
	o->len = payload - sizeof(struct udphdr);
	o->overhead = OVERHEAD6;
	return CARRY;
}

/* NOT_OURS, CARRY, DROP_TTL_EXCEEDED or DROP_TOO_BIG (with `d` filled in: the packet the
 * sender must be answered about), or another drop reason. `frame_len` is the whole frame's
 * length, of which [data, end) is the part the program can read; `super` says the frame is a
 * GSO super-packet (TC only), larger than the MTU by design. */
static __always_inline int check_datagram(void *data, void *end, __u32 frame_len, int super,
					  struct config *cfg, struct datagram *d)
{
	/* Anything that is not UDP to this node's address and port is not ours, whatever it is
	 * (the stack judges it as it always does). What is ours and not carried is counted here:
	 * the node's socket on the port would only read it. */
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return NOT_OURS;
	struct outer o;
	int found;
	if (eth->h_proto == bpf_htons(ETH_P_IP))
		found = check_outer4(data, end, frame_len, cfg, &o);
	else if (eth->h_proto == bpf_htons(ETH_P_IPV6))
		found = check_outer6(data, end, frame_len, cfg, &o);
	else
		return NOT_OURS;
	if (found != CARRY)
		return found;

	__u8 *version = o.inner;
	if ((void *)(version + 1) > end)
		return DROP_MALFORMED;
	int verdict;
	switch (*version >> 4) {
	case 4:
		verdict = check_inner4(o.inner, end, o.len, o.peer, super, cfg);
		break;
	case 6:
		verdict = check_inner6(o.inner, end, o.len, o.peer, super, cfg);
		break;
	default:
		return DROP_MALFORMED;
	}
	if (verdict != CARRY && verdict != DROP_TTL_EXCEEDED && verdict != DROP_TOO_BIG)
		return verdict;
	d->family = *version >> 4;
	d->peer = o.peer;
	d->inner = o.inner;
	d->len = o.len;
	d->overhead = o.overhead;
	return verdict;
}
