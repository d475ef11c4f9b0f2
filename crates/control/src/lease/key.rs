//! Lease keys in etcd, exactly as flanneld names them (its `MakeSubnetKey` and
//! `ParseSubnetKey`): `<prefix>/subnets/10.5.8.0-24`, and for a dual-stack lease the IPv6 subnet
//! in the same key, `<prefix>/subnets/10.5.8.0-24&fd10:0:0:8::-64`, so one key holds both.

use super::Subnets;
use ipnet::{Ipv4Net, Ipv6Net};
use std::net::{Ipv4Addr, Ipv6Addr};

/// Why a key is not a lease key: the key (up to a bound: whoever writes keys chooses their
/// length), and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("not a subnet lease key: {} ({why})", crate::shown::quoted(key))]
pub struct KeyError {
    key: String,
    why: &'static str,
}

/// `<prefix>/subnets/` — every lease lives below it.
pub fn subnets_prefix(prefix: &str) -> String {
    format!("{}/subnets/", prefix.trim_end_matches('/'))
}

/// The etcd key of an IPv4 lease's `subnet` under `prefix`: network address, dash, prefix length.
pub fn subnet_key(prefix: &str, subnet: Ipv4Net) -> String {
    lease_key(prefix, Subnets::V4(subnet))
}

/// The etcd key of a lease: [`subnet_key`], then `&`, the IPv6 network address (in the
/// shortest form, as Go prints it), dash and prefix length when the lease has an IPv6 subnet.
/// An IPv6-only lease's IPv4 part is flanneld's empty one, `0.0.0.0-0`.
pub fn lease_key(prefix: &str, subnets: Subnets) -> String {
    format!("{}{}", subnets_prefix(prefix), key_name(subnets))
}

/// A lease key's part after `<prefix>/subnets/`, e.g. `10.5.8.0-24&fd10:0:0:8::-64`.
pub fn key_name(subnets: Subnets) -> String {
    let v4 = subnets.v4().unwrap_or(EMPTY_IPV4);
    let v4 = format!("{}-{}", v4.network(), v4.prefix_len());
    match subnets.v6() {
        None => v4,
        Some(v6) => format!("{v4}&{}-{}", v6.network(), v6.prefix_len()),
    }
}

/// flanneld's IPv4 part of an IPv6-only lease's key, `0.0.0.0-0`: no IPv4 subnet.
const EMPTY_IPV4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::UNSPECIFIED, 0);

/// Parses a lease key into its subnets. flanneld writes an IPv6-only lease as
/// `0.0.0.0-0&<v6>-<len>`: that is a lease with an IPv6 subnet only. `0.0.0.0-0` alone names
/// no subnet at all, and is refused.
pub fn parse_lease_key(prefix: &str, key: &str) -> Result<Subnets, KeyError> {
    let bad = |why| KeyError {
        key: key.to_string(),
        why,
    };
    let name = key
        .strip_prefix(&subnets_prefix(prefix))
        .ok_or_else(|| bad("not under <prefix>/subnets/"))?;
    let (v4, v6) = match name.split_once('&') {
        Some((v4, v6)) => (v4, Some(v6)),
        None => (name, None),
    };
    let v4 = Some(parse_ipv4(v4).map_err(bad)?).filter(|&s| s != EMPTY_IPV4);
    let v6 = v6.map(parse_ipv6).transpose().map_err(bad)?;
    Subnets::from_parts(v4, v6)
        .ok_or_else(|| bad("the empty IPv4 subnet 0.0.0.0-0 without an IPv6 subnet"))
}

fn parse_ipv4(text: &str) -> Result<Ipv4Net, &'static str> {
    let (addr, len) = text
        .split_once('-')
        .ok_or("no \"-\" between the IPv4 address and prefix length")?;
    let addr: Ipv4Addr = addr.parse().map_err(|_| "not an IPv4 address")?;
    let len: u8 = len
        .parse()
        .map_err(|_| "the IPv4 prefix length is no number")?;
    let subnet = Ipv4Net::new(addr, len).map_err(|_| "the IPv4 prefix length is over 32")?;
    // A key with host bits set is not one flannel writes; refusing it avoids two keys per subnet.
    if subnet.trunc() != subnet {
        return Err("the IPv4 address has host bits set");
    }
    Ok(subnet)
}

fn parse_ipv6(text: &str) -> Result<Ipv6Net, &'static str> {
    let (addr, len) = text
        .rsplit_once('-')
        .ok_or("no \"-\" between the IPv6 address and prefix length")?;
    // flanneld's key pattern takes lower-case hex digits and colons only.
    if !addr
        .bytes()
        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f' | b':'))
    {
        return Err("the IPv6 address has characters flannel does not write");
    }
    let addr: Ipv6Addr = addr
        .parse()
        .map_err(|_| "not an IPv6 address after \"&\"")?;
    let len: u8 = len
        .parse()
        .map_err(|_| "the IPv6 prefix length is no number")?;
    let subnet = Ipv6Net::new(addr, len).map_err(|_| "the IPv6 prefix length is over 128")?;
    if subnet.trunc() != subnet {
        return Err("the IPv6 address has host bits set");
    }
    Ok(subnet)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFIX: &str = "/coreos.com/network";

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    fn net6(s: &str) -> Ipv6Net {
        s.parse().unwrap()
    }

    #[test]
    fn key_format_and_parse() {
        let key = subnet_key(PREFIX, net("10.5.8.0/24"));
        assert_eq!(key, "/coreos.com/network/subnets/10.5.8.0-24");
        assert_eq!(
            parse_lease_key(PREFIX, &key).unwrap(),
            Subnets::V4(net("10.5.8.0/24"))
        );
        assert_eq!(
            subnet_key("/p/", net("10.5.8.0/24")),
            "/p/subnets/10.5.8.0-24"
        );
    }

    #[test]
    fn an_ipv6_only_key_is_a_lease_with_no_ipv4_subnet() {
        let v6 = net6("fd10:0:0:9::/64");
        let key = lease_key(PREFIX, Subnets::V6(v6));
        assert_eq!(key, "/coreos.com/network/subnets/0.0.0.0-0&fd10:0:0:9::-64");
        assert_eq!(parse_lease_key(PREFIX, &key).unwrap(), Subnets::V6(v6));
        let err = parse_lease_key(PREFIX, "/coreos.com/network/subnets/0.0.0.0-0")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "not a subnet lease key: \"/coreos.com/network/subnets/0.0.0.0-0\" \
             (the empty IPv4 subnet 0.0.0.0-0 without an IPv6 subnet)"
        );
    }

    #[test]
    fn dual_stack_keys_as_flanneld_makes_and_parses_them() {
        let cases = [
            (
                "10.5.1.0/24",
                "fd10:0:0:1::/64",
                "10.5.1.0-24&fd10:0:0:1::-64",
            ),
            ("10.5.2.0/24", "fc00::/64", "10.5.2.0-24&fc00::-64"),
            (
                "10.5.0.64/26",
                "2001:db8:0:ab00::/56",
                "10.5.0.64-26&2001:db8:0:ab00::-56",
            ),
        ];
        for (v4, v6, name) in cases {
            let subnets = Subnets::Dual(net(v4), net6(v6));
            let key = lease_key(PREFIX, subnets);
            assert_eq!(key, format!("{PREFIX}/subnets/{name}"));
            assert_eq!(parse_lease_key(PREFIX, &key).unwrap(), subnets);
        }
        // The long form flanneld would also read parses to the same subnet.
        let long = format!("{PREFIX}/subnets/10.5.1.0-24&fd10:0:0:1:0:0:0:0-64");
        let subnets = parse_lease_key(PREFIX, &long).unwrap();
        assert_eq!(subnets.v6(), Some(net6("fd10:0:0:1::/64")));
        assert_eq!(
            lease_key(PREFIX, Subnets::V4(net("10.5.1.0/24"))),
            subnet_key(PREFIX, net("10.5.1.0/24"))
        );
    }

    #[test]
    fn bad_keys_are_refused_with_the_reason() {
        let cases = [
            ("/coreos.com/network/config", "not under <prefix>/subnets/"),
            ("/other/subnets/10.5.8.0-24", "not under"),
            ("/coreos.com/network/subnets/10.5.8.0", "no \"-\""),
            ("/coreos.com/network/subnets/10.5.8.0-33", "over 32"),
            ("/coreos.com/network/subnets/10.5.8.1-24", "host bits"),
            ("/coreos.com/network/subnets/x-24", "not an IPv4 address"),
            (
                "/coreos.com/network/subnets/10.5.8.0-24&",
                "no \"-\" between the IPv6",
            ),
            (
                "/coreos.com/network/subnets/10.5.8.0-24&garbage-64",
                "characters flannel does not write",
            ),
            (
                "/coreos.com/network/subnets/10.5.8.0-24&FD10::-64",
                "characters flannel does not write",
            ),
            (
                "/coreos.com/network/subnets/10.5.8.0-24&fd10::1-64",
                "IPv6 address has host bits",
            ),
            (
                "/coreos.com/network/subnets/10.5.8.0-24&fd10::-129",
                "over 128",
            ),
            (
                "/coreos.com/network/subnets/10.5.8.0-24&fd10::-x",
                "IPv6 prefix length is no number",
            ),
            (
                "/coreos.com/network/subnets/10.5.8.0-24&fd10:::1::-64",
                "not an IPv6 address",
            ),
            (
                "/coreos.com/network/subnets/10.5.8.0-24&fd10::-64&fd11::-64",
                "characters flannel",
            ),
            (
                "/coreos.com/network/subnets/10.5.8.0-24&::ffff:10.0.0.0-120",
                "characters flannel",
            ),
        ];
        for (key, why) in cases {
            let err = parse_lease_key(PREFIX, key).expect_err(key).to_string();
            assert!(
                err.starts_with(&format!("not a subnet lease key: {key:?} (")) && err.contains(why),
                "{key}: got {err:?}, want {why:?}"
            );
        }
    }
}
