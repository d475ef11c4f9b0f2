/* flannel's udp wire in the kernel: the UDP payload is the bare inner IPv4 or IPv6 packet,
 * over the IPv4 underlay or (config6 set: Backend.Underlay "ipv6") the IPv6 one.
 *
 * twill_egress runs at the egress of twill's dummy device, to which the whole flannel network
 * is routed: it encapsulates and sends the packet to the peer that owns its destination.
 * twill_ingress runs at the underlay's ingress: it takes only UDP to this node's address and
 * port, checks the datagram as the userspace engine does, decapsulates it and hands the inner
 * packet to the stack as if it had arrived on the dummy device. twill_xdp_ingress, on the
 * underlay where its driver takes native XDP, does the same to each wire frame before GRO and
 * passes it up marked; twill_ingress then only moves it into the device.
 *
 * On a veth underlay, which hands the other namespace what this one's stack made (TCP
 * super-packets whole, checksums still to be filled in, UDP GSO trains as one skb), what a
 * socket must read as datagrams takes a detour through the segmenter, a veth pair that
 * segments and checksums at transmit as a NIC does: a packet to a peer that reads from a socket,
 * and a train from a peer that sends them. twill_segmented, at the pair's other end, then does
 * what twill_egress or twill_ingress would have, to each packet of it.
 *
 * A packet is never dropped without a count under the reason the userspace engine uses; one
 * with no route, or whose TTL runs out here, is answered with the ICMP error the userspace
 * engine answers it with (icmp.h). */

#include "icmp.h"
#include "ingress.h"

#define ENCAP_FLAGS \
	(BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP)
#define ENCAP6_FLAGS \
	(BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP)
/* FIXED_GSO both ways: the device MTU already leaves room for the outer headers, so a
 * super-packet's segment size stays the sender's. No BPF_F_ADJ_ROOM_DECAP_L3_* flag (Linux
 * 6.3+): an IPv4 inner packet has the outer one's protocol, an IPv6 one gets its own from the
 * ethertype written (ethertype_of), and kernels from 5.10 take the shrink as it is. */
#define DECAP_FLAGS BPF_F_ADJ_ROOM_FIXED_GSO

/* The inner packet's length and its peer's route, found by route4 or route6. */
struct routed {
	struct route *route;
	__u32 len;
};

/* The packet goes through the segmenter first (its peer reads datagrams from a socket, and the
 * underlay is a veth); it is routed again when it comes back, its TTL not yet decremented. */
#define DIVERT (-4)

/* Whether a packet to `route` goes through the segmenter at `segmenter` (0: none, or it is
 * coming back from there). */
static __always_inline int diverted(struct route *route, __u32 segmenter)
{
	return segmenter && !(route->flags & ROUTE_SUPER_PACKETS);
}

/* An IPv4 packet from the stack: checked, routed, its TTL decremented. 0, DIVERT or the drop
 * reason. */
static __always_inline int route4(struct __sk_buff *skb, struct routed *r, __u32 segmenter)
{
	if (linear(skb, ETH_HLEN + sizeof(struct iphdr)))
		return DROP_MALFORMED;
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + ETH_HLEN;
	if ((void *)(ip + 1) > end)
		return DROP_MALFORMED;
	if (ip->version != 4)
		return DROP_NOT_IPV4;
	__u32 len = bpf_ntohs(ip->tot_len);
	if (ip->ihl < 5 || len < ip->ihl * 4U || len > skb->len - ETH_HLEN)
		return DROP_MALFORMED;
	if (len > 0xffff - OVERHEAD)
		return DROP_TOO_BIG;
	struct route_key key = { .prefixlen = 32, .addr = ip->daddr };
	r->route = bpf_map_lookup_elem(&routes, &key);
	if (!r->route)
		return DROP_NO_ROUTE;
	if (ip->ttl <= 1)
		return DROP_TTL_EXCEEDED;
	if (diverted(r->route, segmenter))
		return DIVERT;
	decrement_ttl(ip);
	r->len = len;
	return 0;
}

/* The same of an IPv6 packet, by its hop limit, which has no checksum to patch. */
static __always_inline int route6(struct __sk_buff *skb, struct routed *r, __u32 segmenter)
{
	if (linear(skb, ETH_HLEN + sizeof(struct ipv6hdr)))
		return DROP_MALFORMED;
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ipv6hdr *ip = data + ETH_HLEN;
	if ((void *)(ip + 1) > end)
		return DROP_MALFORMED;
	if (ip->version != 6)
		return DROP_NOT_IPV4;
	__u32 len = bpf_ntohs(ip->payload_len) + sizeof(struct ipv6hdr);
	if (jumbogram(ip) || len > skb->len - ETH_HLEN)
		return DROP_MALFORMED;
	if (len > 0xffff - OVERHEAD)
		return DROP_TOO_BIG;
	struct route_key6 key = { .prefixlen = 128 };
	__builtin_memcpy(key.addr, &ip->daddr, sizeof(key.addr));
	r->route = bpf_map_lookup_elem(&routes6, &key);
	if (!r->route)
		return DROP_NO_ROUTE;
	if (ip->hop_limit <= 1)
		return DROP_TTL_EXCEEDED;
	if (diverted(r->route, segmenter))
		return DIVERT;
	ip->hop_limit--;
	r->len = len;
	return 0;
}

/* `room` bytes before a packet that is no super-packet, unmarked as encapsulated: for one that
 * came in through the tunnel and goes back out (an ICMP error about it, or one routed back),
 * which a peer's program over a veth can have left marked, and the kernel will not mark twice
 * (EALREADY). The skb is told the outer family as marking would (bpf_skb_change_proto takes
 * away, 6 to 4, or puts in, 4 to 6, the 20 bytes the headers differ by, in the room). */
static __always_inline int grow_unmarked(struct __sk_buff *skb, __u32 room, __be16 ethertype)
{
	__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO;
	if (skb->protocol == ethertype)
		return bpf_skb_adjust_room(skb, room, BPF_ADJ_ROOM_MAC, flags);
	__u32 before = ethertype == bpf_htons(ETH_P_IP) ? room + 20 : room - 20;
	if (bpf_skb_adjust_room(skb, before, BPF_ADJ_ROOM_MAC, flags))
		return -1;
	return bpf_skb_change_proto(skb, ethertype, 0);
}

/* Room before the routed packet (`flags` say the outer family), then the outer IP header of
 * `ip_size` bytes at `ip` and `udp` after it, in a frame of the outer family's `ethertype` (an
 * IPv6 inner packet may leave in an IPv4 frame: bpf_skb_adjust_room sets the skb's protocol
 * to the outer family). 0 or DROP_IO_ERROR. */
static __always_inline int push_outer(struct __sk_buff *skb, __u64 flags, __be16 ethertype,
				      void *ip, __u32 ip_size, struct udphdr *udp)
{
	__u32 room = ip_size + sizeof(*udp);
	int grown = bpf_skb_adjust_room(skb, room, BPF_ADJ_ROOM_MAC, flags);
	if (grown && !skb->gso_size)
		grown = grow_unmarked(skb, room, ethertype);
	if (grown ||
	    bpf_skb_store_bytes(skb, 2 * ETH_ALEN, &ethertype, sizeof(ethertype), 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, ip, ip_size, 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + ip_size, udp, sizeof(*udp), 0))
		return DROP_IO_ERROR;
	return 0;
}

/* The outer IPv4 and UDP headers before the routed packet, as flanneld's socket sends them:
 * DF set, TTL 64, source and destination port the network's port. Bytes after the inner
 * packet's total length (none from the stack) ride along as padding the receiver ignores. The
 * UDP checksum is 0, which IPv4 allows. 0 or the drop reason. */
static __always_inline int encapsulate4(struct __sk_buff *skb, struct routed *r,
					struct config *cfg)
{
	__u32 len = r->len;
	struct iphdr outer = {
		.version = 4,
		.ihl = 5,
		.tot_len = bpf_htons(len + OVERHEAD),
		.frag_off = bpf_htons(IP_DF),
		.ttl = OUTER_TTL,
		.protocol = IPPROTO_UDP,
		.saddr = cfg->local_ip,
		.daddr = r->route->endpoint,
	};
	outer.check = header_checksum(&outer);
	struct udphdr udp = {
		.source = cfg->port,
		.dest = r->route->port,
		.len = bpf_htons(len + sizeof(struct udphdr)),
	};
	return push_outer(skb, ENCAP_FLAGS, bpf_htons(ETH_P_IP), &outer, sizeof(outer), &udp);
}

/* The same over the IPv6 underlay, from `local` to the peer's IPv6 underlay address (by its
 * slot; a peer without one has no route here), hop limit 64. The UDP checksum is 0, as the
 * kernel's VXLAN sends with udp6zerocsumtx (RFC 6935/6936): the egress hook sees TCP
 * super-packets and inner checksums still to be filled in, and nothing a BPF program can set
 * makes segmentation fill the outer one; every twill node takes it (UDP_NO_CHECK6_RX). */
static __always_inline int encapsulate6(struct __sk_buff *skb, struct routed *r,
					struct config *cfg, struct addr6 *local)
{
	__u32 slot = r->route->slot;
	struct addr6 *endpoint = bpf_map_lookup_elem(&endpoints6, &slot);
	if (!endpoint)
		return DROP_NO_ROUTE;
	__u32 len = r->len;
	struct ipv6hdr outer = {
		.version = 6,
		.payload_len = bpf_htons(len + sizeof(struct udphdr)),
		.nexthdr = IPPROTO_UDP,
		.hop_limit = OUTER_TTL,
	};
	__builtin_memcpy(&outer.saddr, local->addr, sizeof(outer.saddr));
	__builtin_memcpy(&outer.daddr, endpoint->addr, sizeof(outer.daddr));
	struct udphdr udp = {
		.source = cfg->port,
		.dest = r->route->port,
		.len = bpf_htons(len + sizeof(struct udphdr)),
	};
	return push_outer(skb, ENCAP6_FLAGS, bpf_htons(ETH_P_IPV6), &outer, sizeof(outer), &udp);
}

/* Encapsulates a packet from the stack and sends it to its peer, or (`segmenter` not 0) into
 * the segmenter when its peer needs that. */
static __always_inline int send_out(struct __sk_buff *skb, __u32 segmenter)
{
	struct routed r = {};
	int dropped;
	if (skb->protocol == bpf_htons(ETH_P_IP))
		dropped = route4(skb, &r, segmenter);
	else if (skb->protocol == bpf_htons(ETH_P_IPV6))
		dropped = route6(skb, &r, segmenter);
	else
		dropped = DROP_NOT_IPV4;
	if (dropped == DIVERT)
		return bpf_redirect(segmenter, 0);
	struct config *cfg = node_config();
	if (!dropped && !cfg)
		dropped = DROP_NO_ROUTE;
	if (dropped == DROP_NO_ROUTE || dropped == DROP_TTL_EXCEEDED)
		return answer(skb, skb->protocol == bpf_htons(ETH_P_IPV6) ? 6 : 4, dropped, cfg);
	if (dropped || !r.route || !cfg)
		return drop(dropped);

	__u32 slot = r.route->slot;
	__u32 underlay = cfg->underlay_ifindex;
	__u64 packets = packets_in(skb);
	struct addr6 *local6 = node_config6();
	int sent = local6 ? encapsulate6(skb, &r, cfg, local6) : encapsulate4(skb, &r, cfg);
	if (sent)
		return drop(sent);
	count_tx(slot, packets, r.len);
	return bpf_redirect_neigh(underlay, NULL, 0, 0);
}

SEC("classifier/egress")
int twill_egress(struct __sk_buff *skb)
{
	return send_out(skb, segmenter_ifindex());
}

/* What twill_xdp_ingress puts before a frame it decapsulated, for twill_ingress to find: only
 * an XDP program writes there, so no sender can forge it. */
#define DECAPSULATED 0x74774470 /* "twDp" */

/* The frame enters the device: addressed to any other MAC the stack would take it for another
 * host's and drop it. */
static __always_inline int enter_device(struct __sk_buff *skb, struct config *cfg)
{
	__u32 device = cfg->device_ifindex;
	if (bpf_skb_store_bytes(skb, 0, cfg->device_mac, ETH_ALEN, 0))
		return drop(DROP_IO_ERROR);
	return bpf_redirect(device, BPF_F_INGRESS);
}

/* The inner packet's ethertype, in place of the outer one. Entering the device, the frame's
 * protocol is taken from it (eth_type_trans), which is how an IPv6 packet decapsulated from
 * IPv4 gets its own: BPF_F_ADJ_ROOM_DECAP_L3_IPV6 would say so too, but only from Linux 6.3. */
static __always_inline __be16 ethertype_of(__u8 family)
{
	return bpf_htons(family == 6 ? ETH_P_IPV6 : ETH_P_IP);
}

/* The TTL or hop limit of the inner packet of `family` at `inner`, decremented as a router
 * does (the checks made sure there is one left); -1 when its header is not within `end`. */
static __always_inline int decrement_hops(void *inner, void *end, __u8 family)
{
	if (family == 6) {
		struct ipv6hdr *ip = inner;
		if ((void *)(ip + 1) > end)
			return -1;
		ip->hop_limit--;
		return 0;
	}
	struct iphdr *ip = inner;
	if ((void *)(ip + 1) > end)
		return -1;
	decrement_ttl(ip);
	return 0;
}

static __always_inline int decapsulated_at_xdp(struct __sk_buff *skb)
{
	void *meta = (void *)(long)skb->data_meta;
	void *data = (void *)(long)skb->data;
	return meta + sizeof(__u32) <= data && *(__u32 *)meta == DECAPSULATED;
}

/* Takes the outer headers off, and gives the frame the inner packet's ethertype. An IPv4
 * inner packet under an outer IPv6 header: the skb turns IPv4 first (bpf_skb_change_proto
 * takes 20 of the outer header's bytes), since bpf_skb_adjust_room leaves no less than a
 * header of the skb's family, and an IPv4 packet may be shorter than an IPv6 header. 0 or -1. */
static __always_inline int decapsulate(struct __sk_buff *skb, struct datagram *d)
{
	__u32 overhead = d->overhead;
	if (overhead == OVERHEAD6 && d->family == 4) {
		if (bpf_skb_change_proto(skb, bpf_htons(ETH_P_IP), 0))
			return -1;
		overhead = OVERHEAD;
	}
	__be16 ethertype = ethertype_of(d->family);
	if (bpf_skb_adjust_room(skb, -(__s32)overhead, BPF_ADJ_ROOM_MAC, DECAP_FLAGS) ||
	    bpf_skb_store_bytes(skb, 2 * ETH_ALEN, &ethertype, sizeof(ethertype), 0))
		return -1;
	return 0;
}

/* Whether the frame is UDP to this node's underlay address (IPv4, or IPv6 over the IPv6
 * underlay, or a fragment there), read from its first bytes. */
static __always_inline int may_be_ours(struct __sk_buff *skb, struct config *cfg)
{
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		if (linear(skb, ETH_HLEN + sizeof(struct iphdr)))
			return 0;
		struct iphdr *outer = (void *)(long)skb->data + ETH_HLEN;
		if ((void *)(outer + 1) > (void *)(long)skb->data_end)
			return 0;
		return outer->protocol == IPPROTO_UDP && outer->daddr == cfg->local_ip;
	}
	struct addr6 *local = node_config6();
	if (skb->protocol != bpf_htons(ETH_P_IPV6) || !local ||
	    linear(skb, ETH_HLEN + sizeof(struct ipv6hdr)))
		return 0;
	struct ipv6hdr *outer = (void *)(long)skb->data + ETH_HLEN;
	if ((void *)(outer + 1) > (void *)(long)skb->data_end)
		return 0;
	return (outer->nexthdr == IPPROTO_UDP || outer->nexthdr == IPPROTO_FRAGMENT) &&
	       same_addr6(&outer->daddr, local);
}

/* Checks a frame that may be ours and carries it into the device, or (`segmenter` not 0) a
 * train of datagrams into the segmenter. */
static __always_inline int take_in(struct __sk_buff *skb, struct config *cfg, __u32 segmenter)
{
	__u32 checked = skb->len < CHECKED_BYTES ? skb->len : CHECKED_BYTES;
	if (linear(skb, checked))
		return TC_ACT_OK;

	struct datagram d;
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	int found = check_datagram(data, end, skb->len, skb->gso_size != 0, cfg, &d);
	if (found == NOT_OURS)
		return TC_ACT_OK;
	if (found == TRAIN && segmenter)
		return bpf_redirect(segmenter, 0);
	if (found == TRAIN)
		return drop(DROP_MALFORMED);
	/* The sender is answered through the tunnel, from the inner packet: the TTL it sent ran
	 * out here, or its packet is larger than this node's device takes. */
	if (found == DROP_TTL_EXCEEDED || found == DROP_TOO_BIG) {
		if (decapsulate(skb, &d))
			return drop(found);
		return answer(skb, d.family, found, cfg);
	}
	if (found != CARRY)
		return drop(found);
	if (decrement_hops(d.inner, end, d.family))
		return drop(DROP_MALFORMED);
	__u32 slot = d.peer->slot;
	__u64 packets = packets_in(skb);
	if (decapsulate(skb, &d))
		return drop(DROP_IO_ERROR);
	count_rx(slot, packets, d.len);
	return enter_device(skb, cfg);
}

SEC("classifier/ingress")
int twill_ingress(struct __sk_buff *skb)
{
	struct config *cfg = node_config();
	if (!cfg)
		return TC_ACT_OK;
	/* Checked and decapsulated before GRO, which has coalesced its TCP since. */
	if (decapsulated_at_xdp(skb))
		return enter_device(skb, cfg);
	/* Only what may be ours is pulled into the linear part for the checks. */
	if (!may_be_ours(skb, cfg))
		return TC_ACT_OK;
	return take_in(skb, cfg, segmenter_ifindex());
}

/* At the ingress of the segmenter's receiving end: each packet the segmenter made of what
 * twill_egress or twill_ingress sent into it, now one wire datagram or one checksummed inner
 * packet, which neither goes back into it. Whatever else arrives there (nothing should) is
 * judged as a packet from the stack would be. */
SEC("classifier/segmented")
int twill_segmented(struct __sk_buff *skb)
{
	struct config *cfg = node_config();
	if (cfg && may_be_ours(skb, cfg))
		return take_in(skb, cfg, 0);
	return send_out(skb, 0);
}

/* The same checks on the wire frame, before GRO: the inner packet goes up the underlay's
 * receive path with a mark, where GRO coalesces its TCP as it does any other, and
 * twill_ingress moves it into the device. */
SEC("xdp")
int twill_xdp_ingress(struct xdp_md *ctx)
{
	struct config *cfg = node_config();
	if (!cfg)
		return XDP_PASS;
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct datagram d;
	int found = check_datagram(data, end, end - data, 0, cfg, &d);
	/* Answered at TC (twill_ingress), which an unmarked frame goes on to. */
	if (found == NOT_OURS || found == DROP_TTL_EXCEEDED || found == DROP_TOO_BIG)
		return XDP_PASS;
	if (found != CARRY) {
		count_drop(found);
		return XDP_DROP;
	}
	__u32 slot = d.peer->slot;
	__u32 len = d.len;
	__u8 family = d.family;
	__u32 overhead = d.overhead;
	/* The outer Ethernet header, as it was, moves up to the inner packet (of its family). */
	struct ethhdr eth = *(struct ethhdr *)data;
	eth.h_proto = ethertype_of(family);
	/* No room for the mark: twill_ingress checks the frame as it is, at TC. */
	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(__u32)))
		return XDP_PASS;
	if (bpf_xdp_adjust_head(ctx, overhead)) {
		count_drop(DROP_IO_ERROR);
		return XDP_DROP;
	}
	void *meta = (void *)(long)ctx->data_meta;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	if (meta + sizeof(__u32) > data || data + ETH_HLEN > end ||
	    decrement_hops(data + ETH_HLEN, end, family)) {
		count_drop(DROP_IO_ERROR);
		return XDP_DROP;
	}
	*(__u32 *)meta = DECAPSULATED;
	*(struct ethhdr *)data = eth;
	count_rx(slot, 1, len);
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
