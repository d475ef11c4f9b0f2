/* Helpers on IPv4 and IPv6 headers and on the counters, shared by the programs. */
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "maps.h"

/* flannel's udp wire: an outer IPv4 and a UDP header, then the bare inner packet; over the
 * IPv6 underlay an outer IPv6 header in place of the IPv4 one. */
#define OVERHEAD (sizeof(struct iphdr) + sizeof(struct udphdr))
#define OVERHEAD6 (sizeof(struct ipv6hdr) + sizeof(struct udphdr))
#define IP_DF 0x4000
#define IP_MF 0x2000
#define IP_OFFSET 0x1fff
/* The outer TTL (and IPv6 hop limit) a Linux UDP socket (flanneld's) sends with. */
#define OUTER_TTL 64

static __always_inline struct config *node_config(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&config, &zero);
}

/* The segmenter's sending end, or 0 where there is none (maps.h). */
static __always_inline __u32 segmenter_ifindex(void)
{
	__u32 zero = 0;
	__u32 *ifindex = bpf_map_lookup_elem(&segmenter, &zero);
	return ifindex ? *ifindex : 0;
}

static __always_inline void count_drop(__u32 reason)
{
	__u64 *count = bpf_map_lookup_elem(&drops, &reason);
	if (count)
		*count += 1;
}

/* A TC program's drop, counted. */
static __always_inline int drop(enum drop_reason reason)
{
	count_drop(reason);
	return TC_ACT_SHOT;
}

/* A TCP super-packet is one skb of many segments; it counts as the packets it carries, as the
 * userspace engine counts the segments of a TUN super-packet. */
static __always_inline __u64 packets_in(const struct __sk_buff *skb)
{
	return skb->gso_segs ? skb->gso_segs : 1;
}

static __always_inline void count_tx(__u32 slot, __u64 packets, __u64 bytes)
{
	__u32 zero = 0;
	struct traffic *peer = bpf_map_lookup_elem(&peer_traffic, &slot);
	struct traffic *all = bpf_map_lookup_elem(&totals, &zero);
	if (peer) {
		peer->tx_packets += packets;
		peer->tx_bytes += bytes;
	}
	if (all) {
		all->tx_packets += packets;
		all->tx_bytes += bytes;
	}
}

static __always_inline void count_rx(__u32 slot, __u64 packets, __u64 bytes)
{
	__u32 zero = 0;
	struct traffic *peer = bpf_map_lookup_elem(&peer_traffic, &slot);
	struct traffic *all = bpf_map_lookup_elem(&totals, &zero);
	if (peer) {
		peer->rx_packets += packets;
		peer->rx_bytes += bytes;
	}
	if (all) {
		all->rx_packets += packets;
		all->rx_bytes += bytes;
	}
}

static __always_inline __u16 fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)sum;
}

/* The checksum of a 20-byte header whose check field is zero. */
static __always_inline __u16 header_checksum(const struct iphdr *ip)
{
	const __u16 *word = (const __u16 *)ip;
	__u32 sum = 0;
#pragma unroll
	for (int i = 0; i < (int)(sizeof(*ip) / 2); i++)
		sum += word[i];
	return (__u16)~fold(sum);
}

/* Decrement the TTL as a router does, patching the checksum incrementally (RFC 1624, eqn. 3),
 * as twill_dataplane's Ipv4Packet::decrement_ttl does. The caller checked ttl > 1. */
static __always_inline void decrement_ttl(struct iphdr *ip)
{
	__u16 *word = (__u16 *)&ip->ttl; /* TTL and protocol */
	__u16 old = *word;
	ip->ttl--;
	__u32 sum = (__u16)~ip->check;
	sum += (__u16)~old;
	sum += *word;
	ip->check = (__u16)~fold(sum);
}

/* Whether `addr` lies in `net` (its host bits zero). */
static __always_inline int in_subnet6(const struct in6_addr *addr, const struct subnet6 *net)
{
	const __u32 *a = (const __u32 *)addr->in6_u.u6_addr8;
	const __u32 *n = (const __u32 *)net->addr;
	const __u32 *m = (const __u32 *)net->mask;
	return ((a[0] & m[0]) == n[0]) & ((a[1] & m[1]) == n[1]) & ((a[2] & m[2]) == n[2]) &
	       ((a[3] & m[3]) == n[3]);
}

/* The node's IPv6 underlay address, or NULL over the IPv4 underlay (config6 all zero). */
static __always_inline struct addr6 *node_config6(void)
{
	__u32 zero = 0;
	struct addr6 *local = bpf_map_lookup_elem(&config6, &zero);
	if (!local)
		return NULL;
	const __u32 *a = (const __u32 *)local->addr;
	if (!(a[0] | a[1] | a[2] | a[3]))
		return NULL;
	/* Kept a pointer: a select the compiler might make of the branch is a scalar to the
	 * verifier. */
	asm volatile("" : "+r"(local));
	return local;
}

static __always_inline int same_addr6(const struct in6_addr *addr, const struct addr6 *other)
{
	const __u32 *a = (const __u32 *)addr->in6_u.u6_addr8;
	const __u32 *b = (const __u32 *)other->addr;
	return ((a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3])) == 0;
}

/* An IPv6 header's length field is 0 only in a jumbogram (with a hop-by-hop option), which
 * the userspace engine refuses as malformed, as must the programs. */
static __always_inline int jumbogram(const struct ipv6hdr *ip)
{
	return ip->payload_len == 0 && ip->nexthdr == 0;
}

/* The first `len` bytes in the skb's linear part, pulled in if they are not. */
static __always_inline int linear(struct __sk_buff *skb, __u32 len)
{
	if ((void *)(long)skb->data + len <= (void *)(long)skb->data_end)
		return 0;
	if (skb->len < len)
		return -1;
	return bpf_skb_pull_data(skb, len);
}
