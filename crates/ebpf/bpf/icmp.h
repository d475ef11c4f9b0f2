/* The ICMP and ICMPv6 errors the programs answer a dropped packet with, as the userspace engine
 * and flanneld do (twill_dataplane::wire::icmp and icmpv6 write the same bytes): network
 * unreachable (ICMPv6: no route) for a destination no peer owns, time exceeded (hop limit
 * exceeded) for a packet whose TTL runs out here, fragmentation needed (packet too big) for a
 * peer's packet larger than the device's MTU. The offending packet is turned into the
 * error in place (the new headers put before it, what lies past the quote left outside the
 * error's length) and sent into twill's device, from the device's own address, as if it had
 * arrived there: the stack routes it back to the sender, through the tunnel when the sender
 * is behind a peer. A packet whose checksum is still to be filled (CHECKSUM_PARTIAL: from a
 * container here, or one over a veth) keeps that state, which points into the quote: nothing
 * on the way to its sender fills it, and the sender's stack takes the error as checked. */
#pragma once

#include "packet.h"

#define ICMP_HEADER_LEN 8
/* RFC 792: the offending header and the first 64 bits of its payload. */
#define QUOTED_PAYLOAD 8
/* RFC 4443 2.4 (c): as much of the offender as fits in the minimum IPv6 MTU. */
#define ICMP6_MAX_QUOTED (1280 - sizeof(struct ipv6hdr) - ICMP_HEADER_LEN)
#define IPPROTO_ICMP_ 1
#define IPPROTO_ICMPV6_ 58
/* The types and codes answered with, as linux/icmp.h and linux/icmpv6.h number them. */
#define ICMP_DEST_UNREACH_ 3
#define ICMP_FRAG_NEEDED_ 4
#define ICMP_TIME_EXCEEDED_ 11
#define ICMP6_DEST_UNREACH_ 1
#define ICMP6_PACKET_TOO_BIG_ 2
#define ICMP6_TIME_EXCEEDED_ 3

/* The device's own addresses (maps.h own_addrs): where answers come from. */
static __always_inline struct own_addrs *device_addrs(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&own_addrs, &zero);
}

/* What an answer says: its type and code, the last four bytes of its ICMP header (the MTU, in
 * an error about a packet too big), and whether the ICMP limit may hold it back: an error that
 * carries an MTU never is, as the kernel's are not. */
struct error_kind {
	__u8 type;
	__u8 code;
	__u8 limited;
	__be32 rest;
};

/* Spends one answer from the ICMP limit (maps.h icmp_budget) if it has one now, else counts
 * it held back. 0, or -1 when held back. */
static __always_inline int spend_answer(void)
{
	__u32 zero = 0;
	struct icmp_budget *budget = bpf_map_lookup_elem(&icmp_budget, &zero);
	if (!budget)
		return -1;
	__u64 now = bpf_ktime_get_ns();
	__u64 paid = budget->paid_until;
	if (!budget->interval_ns || (paid > budget->slack_ns && now < paid - budget->slack_ns)) {
		__sync_fetch_and_add(&budget->limited, 1);
		return -1;
	}
	budget->paid_until = (paid > now ? paid : now) + budget->interval_ns;
	return 0;
}

/* The one's complement sum, unfolded, of `len` bytes of the skb at `offset` added to `sum`,
 * read 64 at a time (the last read zero-padded, which adds nothing); `offset` even. At most 20
 * reads: an ICMPv6 error's quote. -1 when the bytes cannot be read. */
static __always_inline __s64 sum_bytes(struct __sk_buff *skb, __u32 offset, __u32 len, __s64 sum)
{
	__u8 chunk[64];
#pragma unroll
	for (int i = 0; i < 20; i++) {
		__u32 done = i * sizeof(chunk);
		if (done >= len)
			break;
		__u32 left = len - done;
		if (left >= sizeof(chunk)) {
			if (bpf_skb_load_bytes(skb, offset + done, chunk, sizeof(chunk)))
				return -1;
		} else {
			__builtin_memset(chunk, 0, sizeof(chunk));
			/* Bounded to 1..64 where the verifier sees it, left itself (1..63: done < len
			 * and left < 64 here) unchanged: the compiler knows left < 64 and would drop a
			 * plain mask, and the 5.10 and 6.1 verifiers take no lower bound from a
			 * `left == 0` test, refusing the read as possibly zero-sized. */
			asm volatile("" : "+r"(left));
			left = ((left - 1) & (sizeof(chunk) - 1)) + 1;
			if (bpf_skb_load_bytes(skb, offset + done, chunk, left))
				return -1;
			return bpf_csum_diff(NULL, 0, (__be32 *)chunk, sizeof(chunk), (__u32)sum);
		}
		sum = bpf_csum_diff(NULL, 0, (__be32 *)chunk, sizeof(chunk), (__u32)sum);
		if (sum < 0)
			return -1;
	}
	return sum;
}

/* Puts `header_len` bytes of room before the packet at ETH_HLEN, where the error's headers go.
 * What lies past the `quoted` bytes the error's length takes in stays behind it, for the stack
 * to trim as it trims any frame's padding (ip_rcv, ipv6_rcv): bpf_skb_change_tail refuses an
 * skb marked encapsulated, as one that crossed a veth from another eBPF node is. A
 * super-packet is cut first all the same (which makes it one packet), and goes unanswered
 * where the kernel will not cut it (marked so, or a checksum to be filled past the cut). 0 or
 * -1. */
static __always_inline int make_room(struct __sk_buff *skb, __u32 quoted, __u32 header_len)
{
	if (skb->gso_size && bpf_skb_change_tail(skb, ETH_HLEN + quoted, 0))
		return -1;
	return bpf_skb_adjust_room(skb, header_len, BPF_ADJ_ROOM_MAC, 0) ? -1 : 0;
}

/* The error `kind`'s headers, `size` bytes at `error` whose last 8 are the ICMP header (all
 * zero, filled in here from `kind`), put before the `quoted` bytes of the packet, the checksum
 * summed over both from `seed` (ICMPv6's pseudo-header); first spent from the ICMP limit where
 * `kind` is one it limits. 0 or -1. */
static __always_inline int put_error(struct __sk_buff *skb, __u8 *error, __u32 size, __u32 quoted,
				     __s64 seed, const struct error_kind *kind)
{
	if ((kind->limited && spend_answer()) || make_room(skb, quoted, size))
		return -1;
	__u8 *icmp = error + size - ICMP_HEADER_LEN;
	icmp[0] = kind->type;
	icmp[1] = kind->code;
	__builtin_memcpy(icmp + 4, &kind->rest, sizeof(kind->rest));
	__s64 sum = sum_bytes(skb, ETH_HLEN + size, quoted, seed);
	if (sum < 0)
		return -1;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)icmp, ICMP_HEADER_LEN, (__u32)sum);
	if (sum < 0)
		return -1;
	__u16 check = (__u16)~fold((__u32)sum);
	__builtin_memcpy(icmp + 2, &check, sizeof(check));
	return bpf_skb_store_bytes(skb, ETH_HLEN, error, size, BPF_F_RECOMPUTE_CSUM) ? -1 : 0;
}

/* The ICMP error `kind` about the IPv4 packet at ETH_HLEN, from `own`. Never about an ICMP
 * error or a later fragment (RFC 1122 3.2.2), nor fragmentation needed about a packet that
 * may be fragmented. 0, or -1 when not answered. */
static __always_inline int answer4(struct __sk_buff *skb, const struct error_kind *kind,
				   __be32 own)
{
	if (!own || linear(skb, ETH_HLEN + sizeof(struct iphdr)))
		return -1;
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + ETH_HLEN;
	if ((void *)(ip + 1) > end)
		return -1;
	__u32 header = ip->ihl * 4U;
	__u32 total = bpf_ntohs(ip->tot_len);
	if (header < sizeof(*ip) || total < header ||
	    ip->frag_off & bpf_htons(IP_OFFSET))
		return -1;
	if (kind->type == ICMP_DEST_UNREACH_ && kind->code == ICMP_FRAG_NEEDED_ &&
	    !(ip->frag_off & bpf_htons(IP_DF)))
		return -1;
	__be32 to = ip->saddr;
	__u32 payload = total - header;
	__u32 quoted = header + (payload < QUOTED_PAYLOAD ? payload : QUOTED_PAYLOAD);
	if (ip->protocol == IPPROTO_ICMP_ && payload) {
		__u8 offender_type;
		if (bpf_skb_load_bytes(skb, ETH_HLEN + header, &offender_type, 1))
			return -1;
		/* Destination unreachable, source quench, redirect, time exceeded, parameter problem. */
		if (offender_type == 3 || offender_type == 4 || offender_type == 5 ||
		    offender_type == 11 || offender_type == 12)
			return -1;
	}
	struct {
		struct iphdr ip;
		__u8 icmp[ICMP_HEADER_LEN];
	} error = {
		.ip = {
			.version = 4,
			.ihl = 5,
			.tot_len = bpf_htons(sizeof(error) + quoted),
			.ttl = OUTER_TTL,
			.protocol = IPPROTO_ICMP_,
			.saddr = own,
			.daddr = to,
		},
	};
	error.ip.check = header_checksum(&error.ip);
	return put_error(skb, (__u8 *)&error, sizeof(error), quoted, 0, kind);
}

/* The ICMPv6 error `kind` about the IPv6 packet at ETH_HLEN, from `own`. Never about an
 * ICMPv6 error, to a multicast destination, or from an address that is not one host's (RFC
 * 4443 2.4 (e)). 0, or -1 when not answered. */
static __always_inline int answer6(struct __sk_buff *skb, const struct error_kind *kind,
				   const struct addr6 *own)
{
	if (linear(skb, ETH_HLEN + sizeof(struct ipv6hdr)))
		return -1;
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ipv6hdr *ip = data + ETH_HLEN;
	if ((void *)(ip + 1) > end)
		return -1;
	const __u32 *src = (const __u32 *)ip->saddr.in6_u.u6_addr8;
	const __u32 *mine = (const __u32 *)own->addr;
	if (!(mine[0] | mine[1] | mine[2] | mine[3]) || !(src[0] | src[1] | src[2] | src[3]) ||
	    ip->saddr.in6_u.u6_addr8[0] == 0xff || ip->daddr.in6_u.u6_addr8[0] == 0xff)
		return -1;
	__u32 total = bpf_ntohs(ip->payload_len) + sizeof(*ip);
	if (ip->nexthdr == IPPROTO_ICMPV6_ && total > sizeof(*ip)) {
		__u8 offender_type;
		if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(*ip), &offender_type, 1))
			return -1;
		if (offender_type < 128)
			return -1;
	}
	__u32 quoted = total < ICMP6_MAX_QUOTED ? total : ICMP6_MAX_QUOTED;
	struct {
		struct ipv6hdr ip;
		__u8 icmp[ICMP_HEADER_LEN];
	} error = {
		.ip = {
			.version = 6,
			.payload_len = bpf_htons(ICMP_HEADER_LEN + quoted),
			.nexthdr = IPPROTO_ICMPV6_,
			.hop_limit = OUTER_TTL,
		},
	};
	__builtin_memcpy(&error.ip.saddr, own->addr, sizeof(error.ip.saddr));
	__builtin_memcpy(&error.ip.daddr, &ip->saddr, sizeof(error.ip.daddr));
	/* The pseudo-header (RFC 8200 8.1): both addresses, the upper-layer length, then three
	 * zero bytes and the next header. */
	struct {
		__u8 addrs[32];
		__be32 len;
		__be32 next;
	} pseudo = {
		.len = bpf_htonl(ICMP_HEADER_LEN + quoted),
		.next = bpf_htonl(IPPROTO_ICMPV6_),
	};
	__builtin_memcpy(pseudo.addrs, &error.ip.saddr, sizeof(pseudo.addrs));
	__s64 seed = bpf_csum_diff(NULL, 0, (__be32 *)&pseudo, sizeof(pseudo), 0);
	if (seed < 0)
		return -1;
	return put_error(skb, (__u8 *)&error, sizeof(error), quoted, seed, kind);
}

/* The error a packet of `family` (4 or 6) dropped for `reason` is answered with: no route,
 * its TTL or hop limit run out, or (the device's `mtu`) too big. */
static __always_inline struct error_kind error_for(__u8 family, enum drop_reason reason, __u16 mtu)
{
	struct error_kind kind = { .limited = 1 };
	if (reason == DROP_TOO_BIG) {
		kind.type = family == 6 ? ICMP6_PACKET_TOO_BIG_ : ICMP_DEST_UNREACH_;
		kind.code = family == 6 ? 0 : ICMP_FRAG_NEEDED_;
		kind.limited = 0;
		kind.rest = bpf_htonl(mtu);
	} else if (reason == DROP_NO_ROUTE) {
		kind.type = family == 6 ? ICMP6_DEST_UNREACH_ : ICMP_DEST_UNREACH_;
	} else {
		kind.type = family == 6 ? ICMP6_TIME_EXCEEDED_ : ICMP_TIME_EXCEEDED_;
	}
	return kind;
}

/* Answers the packet of `family` (4 or 6) at ETH_HLEN, dropped for `reason` (no route, its
 * TTL or hop limit run out, too big for the device), and sends the answer into the device;
 * else drops it. Counted under `reason` either way, as the userspace engine counts what it
 * answers. */
static __always_inline int answer(struct __sk_buff *skb, __u8 family, enum drop_reason reason,
				  struct config *cfg)
{
	count_drop(reason);
	struct own_addrs *own = device_addrs();
	if (!cfg || !own)
		return TC_ACT_SHOT;
	struct error_kind kind = error_for(family, reason, cfg->mtu);
	int answered = -1;
	if (family == 4)
		answered = answer4(skb, &kind, own->ip);
	else if (family == 6)
		answered = answer6(skb, &kind, &own->ip6);
	if (answered)
		return TC_ACT_SHOT;
	if (bpf_skb_store_bytes(skb, 0, cfg->device_mac, ETH_ALEN, 0))
		return TC_ACT_SHOT;
	return bpf_redirect(cfg->device_ifindex, BPF_F_INGRESS);
}
