/* flannel's udp wire in the kernel: the UDP payload is the bare inner IPv4 packet.
 *
 * twill_egress runs at the egress of twill's dummy device, to which the whole flannel network
 * is routed: it encapsulates and sends the packet to the peer that owns its destination.
 * twill_ingress runs at the underlay's ingress: it takes only UDP to this node's address and
 * port, checks the datagram as the userspace engine does, decapsulates it and hands the inner
 * packet to the stack as if it had arrived on the dummy device.
 *
 * A packet is never dropped without a count under the reason the userspace engine uses. */

#include "packet.h"

#define ENCAP_FLAGS \
	(BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP)
/* FIXED_GSO both ways: the device MTU already leaves room for the outer headers, so a
 * super-packet's segment size stays the sender's. No BPF_F_ADJ_ROOM_DECAP_L3_* flag (Linux
 * 6.3+): the inner packet is IPv4 like the outer one, so the skb's protocol stays right, and
 * kernels from 5.10 take the shrink as it is. */
#define DECAP_FLAGS BPF_F_ADJ_ROOM_FIXED_GSO

SEC("classifier/egress")
int twill_egress(struct __sk_buff *skb)
{
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return drop(DROP_NOT_IPV4);
	if (linear(skb, ETH_HLEN + sizeof(struct iphdr)))
		return drop(DROP_MALFORMED);
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + ETH_HLEN;
	if ((void *)(ip + 1) > end)
		return drop(DROP_MALFORMED);
	if (ip->version != 4)
		return drop(DROP_NOT_IPV4);
	__u32 len = bpf_ntohs(ip->tot_len);
	if (ip->ihl < 5 || len < ip->ihl * 4U || len > skb->len - ETH_HLEN)
		return drop(DROP_MALFORMED);
	if (len > 0xffff - OVERHEAD)
		return drop(DROP_TOO_BIG);

	struct config *cfg = node_config();
	struct route_key key = { .prefixlen = 32, .addr = ip->daddr };
	struct route *route = bpf_map_lookup_elem(&routes, &key);
	if (!cfg || !route)
		return drop(DROP_NO_ROUTE);
	if (ip->ttl <= 1)
		return drop(DROP_TTL_EXCEEDED);
	decrement_ttl(ip);

	/* As flanneld's socket sends: DF set, TTL 64, source and destination port the network's
	 * port. Bytes after the inner packet's total length (none from the stack) ride along as
	 * padding the receiver ignores. The UDP checksum is 0, which IPv4 allows. */
	struct iphdr outer = {
		.version = 4,
		.ihl = 5,
		.tot_len = bpf_htons(len + OVERHEAD),
		.frag_off = bpf_htons(IP_DF),
		.ttl = OUTER_TTL,
		.protocol = IPPROTO_UDP,
		.saddr = cfg->local_ip,
		.daddr = route->endpoint,
	};
	outer.check = header_checksum(&outer);
	struct udphdr udp = {
		.source = cfg->port,
		.dest = route->port,
		.len = bpf_htons(len + sizeof(struct udphdr)),
	};
	__u32 slot = route->slot;
	__u32 underlay = cfg->underlay_ifindex;
	__u64 packets = packets_in(skb);

	if (bpf_skb_adjust_room(skb, OVERHEAD, BPF_ADJ_ROOM_MAC, ENCAP_FLAGS) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &outer, sizeof(outer), 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(outer), &udp, sizeof(udp), 0))
		return drop(DROP_IO_ERROR);
	count_tx(slot, packets, len);
	return bpf_redirect_neigh(underlay, NULL, 0, 0);
}

/* The inner packet of a datagram that is ours, checked as twill_dataplane's accept_inbound
 * checks it; TC_ACT_REDIRECT into the device, or a counted drop. */
static __always_inline int decap(struct __sk_buff *skb, struct config *cfg, struct peer *peer,
				 __u32 len)
{
	if (len < sizeof(struct iphdr) ||
	    linear(skb, ETH_HLEN + OVERHEAD + sizeof(struct iphdr)))
		return drop(DROP_MALFORMED);
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct iphdr *inner = data + ETH_HLEN + OVERHEAD;
	if ((void *)(inner + 1) > end)
		return drop(DROP_MALFORMED);
	if (inner->version != 4 || inner->ihl < 5 || bpf_ntohs(inner->tot_len) != len ||
	    len < inner->ihl * 4U)
		return drop(DROP_MALFORMED);
	if ((inner->saddr & peer->mask) != peer->subnet)
		return drop(DROP_SPOOFED_SOURCE);
	/* A super-packet is larger by design; the stack checks its segments when it forwards. */
	if (!skb->gso_size && len > cfg->mtu)
		return drop(DROP_TOO_BIG);
	if (inner->ttl <= 1)
		return drop(DROP_TTL_EXCEEDED);
	decrement_ttl(inner);

	__u32 slot = peer->slot;
	__u32 device = cfg->device_ifindex;
	__u64 packets = packets_in(skb);
	/* The frame enters the device: addressed to any other MAC the stack would take it for
	 * another host's and drop it. */
	if (bpf_skb_adjust_room(skb, -(__s32)OVERHEAD, BPF_ADJ_ROOM_MAC, DECAP_FLAGS) ||
	    bpf_skb_store_bytes(skb, 0, cfg->device_mac, ETH_ALEN, 0))
		return drop(DROP_IO_ERROR);
	count_rx(slot, packets, len);
	return bpf_redirect(device, BPF_F_INGRESS);
}

SEC("classifier/ingress")
int twill_ingress(struct __sk_buff *skb)
{
	/* Anything that is not UDP to this node's address and port is not ours: it goes on
	 * untouched, whatever it is (the stack judges it as it always does). What is ours and not
	 * carried is counted: nothing listens on the port, so the stack would drop it unsaid. */
	if (skb->protocol != bpf_htons(ETH_P_IP) || linear(skb, ETH_HLEN + OVERHEAD))
		return TC_ACT_OK;
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct iphdr *outer = data + ETH_HLEN;
	if ((void *)(outer + 1) > end)
		return TC_ACT_OK;
	struct config *cfg = node_config();
	if (!cfg || outer->version != 4 || outer->protocol != IPPROTO_UDP ||
	    outer->daddr != cfg->local_ip)
		return TC_ACT_OK;
	struct fragment_key fragment = { .saddr = outer->saddr, .id = outer->id };
	/* A later fragment has no UDP header to tell whose it is: ours if its first was. */
	if (outer->frag_off & bpf_htons(IP_OFFSET)) {
		if (bpf_map_lookup_elem(&our_fragments, &fragment))
			return drop(DROP_MALFORMED);
		return TC_ACT_OK;
	}
	/* IP options come before the UDP header; its port says whether the datagram is ours. */
	__u32 header = (outer->ihl & 0x0f) * 4;
	if (header < sizeof(struct iphdr) ||
	    linear(skb, ETH_HLEN + header + sizeof(struct udphdr)))
		return TC_ACT_OK;
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	outer = data + ETH_HLEN;
	struct udphdr *udp = data + ETH_HLEN + header;
	if ((void *)(outer + 1) > end || (void *)(udp + 1) > end)
		return TC_ACT_OK;
	if (udp->dest != cfg->port)
		return TC_ACT_OK;

	/* Ours. flannel's peers send no IP options, and with DF: a first fragment is a datagram
	 * this node cannot check whole, and its later fragments go with it. */
	if (header != sizeof(struct iphdr))
		return drop(DROP_MALFORMED);
	if (outer->frag_off & bpf_htons(IP_MF)) {
		__u8 seen = 1;
		bpf_map_update_elem(&our_fragments, &fragment, &seen, BPF_ANY);
		return drop(DROP_MALFORMED);
	}
	struct peer *peer = bpf_map_lookup_elem(&peers, &outer->saddr);
	if (!peer || peer->port != udp->source)
		return drop(DROP_UNKNOWN_PEER);
	__u32 outer_len = bpf_ntohs(outer->tot_len);
	if (outer_len < OVERHEAD || outer_len > skb->len - ETH_HLEN ||
	    bpf_ntohs(udp->len) != outer_len - sizeof(struct iphdr))
		return drop(DROP_MALFORMED);
	return decap(skb, cfg, peer, outer_len - OVERHEAD);
}

char LICENSE[] SEC("license") = "GPL";
