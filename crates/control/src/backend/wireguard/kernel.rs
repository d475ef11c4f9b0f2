//! The hand-off to the kernel's WireGuard, where it exists: `flannel-wg` (and Mode separate's
//! `flannel-wg-v6`) is made as an rtnetlink link of kind "wireguard" and configured over
//! generic netlink (the `wireguard` family), as flannel does through wgctrl: private key and
//! listen port, then one peer per lease (public key, preshared key, endpoint, allowed IPs
//! replaced by the lease's subnets of the families the device carries, keepalive).
//!
//! A kernel without WireGuard refuses the link kind with EOPNOTSUPP; [`create`] then returns
//! `None` and the caller runs twill's userspace WireGuard instead.

use super::{Addressing, DeviceSettings};
use crate::host::netlink::Netlink;
use anyhow::{bail, Context};
use futures::StreamExt;
use genetlink::GenetlinkHandle;
use netlink_packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_REQUEST};
use netlink_packet_generic::GenlMessage;
use netlink_packet_wireguard::{
    WireguardAddressFamily, WireguardAllowedIp, WireguardAllowedIpAttr, WireguardAttribute,
    WireguardCmd, WireguardDeviceFlags, WireguardMessage, WireguardPeer, WireguardPeerAttribute,
    WireguardPeerFlags,
};
use rtnetlink::LinkWireguard;
use std::net::IpAddr;
use twill_dataplane::engine::wireguard::{PublicKey, WgPeerSpec};

/// Peers per set-device message: each takes about 150 bytes, and a message must fit the
/// netlink socket's buffer (wireguard-tools splits the same way).
const PEERS_PER_MESSAGE: usize = 32;

/// `flannel-wg` or `flannel-wg-v6` as a kernel WireGuard device.
pub struct KernelDevice {
    nl: Netlink,
    genl: GenetlinkHandle,
    index: u32,
    name: String,
    settings: DeviceSettings,
}

/// Make `name` a kernel WireGuard device with `settings` and no peers (replacing a device of
/// that name, as flannel does). `None` when this kernel has no WireGuard.
pub async fn create(
    name: &str,
    mtu: u32,
    settings: DeviceSettings,
) -> anyhow::Result<Option<KernelDevice>> {
    let nl = Netlink::connect().context("opening rtnetlink")?;
    if let Some(old) = nl.link_by_name(name).await? {
        tracing::warn!(device = name, "exists; recreating it");
        nl.delete_link(old.index).await?;
    }
    match nl
        .create_link(LinkWireguard::new(name).mtu(mtu).build())
        .await
    {
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => return Ok(None),
        other => other.with_context(|| format!("creating WireGuard device {name}"))?,
    }
    let index = nl.created_link(name).await?.index;
    let (connection, genl, _) = genetlink::new_connection().context("opening generic netlink")?;
    tokio::spawn(connection);
    let mut device = KernelDevice {
        nl,
        genl,
        index,
        name: name.to_string(),
        settings,
    };
    device.replace_peers(&[]).await?;
    Ok(Some(device))
}

impl KernelDevice {
    /// flannel's `Configure` and `ConfigureV6`: for each family the device carries, the
    /// lease's network address as /32 or /128, then the device up, then a route for the whole
    /// network of that family through it.
    pub async fn attach(&self, addressing: &Addressing) -> anyhow::Result<()> {
        let own = addressing.of_families(self.settings.families);
        for (address, _) in &own {
            self.nl.add_address(self.index, *address).await?;
        }
        self.nl.set_up(self.index).await?;
        for (_, network) in own {
            crate::host::route_network_via(&self.nl, network, self.index, &self.name).await?;
        }
        Ok(())
    }

    /// Add or update a peer; a changed key removes the peer of the old one first.
    pub async fn set_peer(
        &mut self,
        old: Option<&WgPeerSpec>,
        new: &WgPeerSpec,
    ) -> anyhow::Result<()> {
        let mut peers = Vec::new();
        if let Some(old) = old.filter(|o| o.public_key != new.public_key) {
            peers.push(removal(&old.public_key));
        }
        peers.push(peer(new, &self.settings));
        self.send(device_message(&self.name, &self.settings, false, peers))
            .await
    }

    pub async fn remove_peer(&mut self, spec: &WgPeerSpec) -> anyhow::Result<()> {
        let peers = vec![removal(&spec.public_key)];
        self.send(device_message(&self.name, &self.settings, false, peers))
            .await
    }

    /// Make the device's peers exactly `specs`.
    pub async fn replace_peers(&mut self, specs: &[WgPeerSpec]) -> anyhow::Result<()> {
        for message in replace_messages(&self.name, &self.settings, specs) {
            self.send(message).await?;
        }
        Ok(())
    }

    async fn send(&mut self, message: WireguardMessage) -> anyhow::Result<()> {
        let mut request = NetlinkMessage::from(GenlMessage::from_payload(message));
        request.header.flags = NLM_F_REQUEST | NLM_F_ACK;
        let mut responses = self.genl.request(request).await?;
        while let Some(response) = responses.next().await {
            if let NetlinkPayload::Error(e) = response?.payload {
                if e.code.is_some() {
                    bail!("configuring WireGuard device {}: {}", self.name, e.to_io());
                }
            }
        }
        Ok(())
    }
}

/// The set-device messages that leave exactly `specs` as peers: the first replaces all peers
/// and sets the key and port, the rest add to it.
pub fn replace_messages(
    name: &str,
    settings: &DeviceSettings,
    specs: &[WgPeerSpec],
) -> Vec<WireguardMessage> {
    let mut chunks = specs.chunks(PEERS_PER_MESSAGE);
    let first = chunks.next().unwrap_or_default();
    let peers = |chunk: &[WgPeerSpec]| chunk.iter().map(|s| peer(s, settings)).collect();
    let mut messages = vec![device_message(name, settings, true, peers(first))];
    messages.extend(chunks.map(|c| device_message(name, settings, false, peers(c))));
    messages
}

/// `WG_CMD_SET_DEVICE` for `name`: the private key and listen port (flannel sends both every
/// time), optionally replacing every peer, then `peers`.
pub fn device_message(
    name: &str,
    settings: &DeviceSettings,
    replace_peers: bool,
    peers: Vec<WireguardPeer>,
) -> WireguardMessage {
    let mut attributes = vec![
        WireguardAttribute::IfName(name.to_string()),
        WireguardAttribute::PrivateKey(*settings.tunnel.private_key.to_bytes()),
        WireguardAttribute::ListenPort(settings.listen_port),
    ];
    if replace_peers {
        attributes.push(WireguardAttribute::Flags(
            WireguardDeviceFlags::ReplacePeers,
        ));
    }
    if !peers.is_empty() {
        attributes.push(WireguardAttribute::Peers(peers));
    }
    WireguardMessage {
        cmd: WireguardCmd::SetDevice,
        attributes,
    }
}

/// One lease's peer: its key, the network's preshared key, its endpoint, the lease's subnets
/// of the families the device carries as its only allowed IPs, and the keepalive (0 turns it
/// off).
pub fn peer(spec: &WgPeerSpec, settings: &DeviceSettings) -> WireguardPeer {
    let mut attributes = vec![
        WireguardPeerAttribute::PublicKey(spec.public_key.0),
        WireguardPeerAttribute::Flags(WireguardPeerFlags::ReplaceAllowedIps),
    ];
    if let Some(psk) = &settings.tunnel.preshared_key {
        attributes.push(WireguardPeerAttribute::PresharedKey(*psk.bytes()));
    }
    let families = settings.families;
    let v4 = families.ipv4().then(|| {
        let subnet = spec.subnet;
        allowed(
            WireguardAddressFamily::Ipv4,
            subnet.network().into(),
            subnet.prefix_len(),
        )
    });
    let v6 = spec.subnet6.filter(|_| families.ipv6()).map(|subnet| {
        allowed(
            WireguardAddressFamily::Ipv6,
            subnet.network().into(),
            subnet.prefix_len(),
        )
    });
    attributes.extend([
        WireguardPeerAttribute::Endpoint(spec.endpoint),
        WireguardPeerAttribute::PersistentKeepalive(settings.tunnel.keepalive.unwrap_or(0)),
        WireguardPeerAttribute::AllowedIps(v4.into_iter().chain(v6).collect()),
    ]);
    WireguardPeer(attributes)
}

fn allowed(family: WireguardAddressFamily, network: IpAddr, prefix: u8) -> WireguardAllowedIp {
    WireguardAllowedIp(vec![
        WireguardAllowedIpAttr::Family(family),
        WireguardAllowedIpAttr::IpAddr(network),
        WireguardAllowedIpAttr::Cidr(prefix),
    ])
}

fn removal(key: &PublicKey) -> WireguardPeer {
    WireguardPeer(vec![
        WireguardPeerAttribute::PublicKey(key.0),
        WireguardPeerAttribute::Flags(WireguardPeerFlags::RemoveMe),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use twill_dataplane::engine::wireguard::{Families, PresharedKey, PrivateKey, TunnelParams};

    const PRIVATE: &str = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";
    const PSK: &str = "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MDA=";

    fn settings(psk: bool) -> DeviceSettings {
        DeviceSettings {
            tunnel: TunnelParams {
                private_key: PrivateKey::from_base64(PRIVATE).unwrap(),
                preshared_key: psk.then(|| PresharedKey::from_base64(PSK).unwrap()),
                keepalive: Some(25),
            },
            listen_port: 51820,
            families: Families::Ipv4,
        }
    }

    fn spec(third: u8) -> WgPeerSpec {
        WgPeerSpec {
            subnet: format!("10.5.{third}.0/24").parse().unwrap(),
            subnet6: None,
            endpoint: format!("10.200.0.{third}:51820").parse().unwrap(),
            public_key: PublicKey([third; 32]),
        }
    }

    /// What the kernel would read: the message through its byte form and back.
    fn on_the_wire(message: WireguardMessage) -> WireguardMessage {
        let mut request = NetlinkMessage::from(GenlMessage::from_payload(message));
        request.header.flags = NLM_F_REQUEST | NLM_F_ACK;
        request.finalize();
        let mut bytes = vec![0u8; request.buffer_len()];
        request.serialize(&mut bytes);
        let parsed = NetlinkMessage::<GenlMessage<WireguardMessage>>::deserialize(&bytes).unwrap();
        let NetlinkPayload::InnerMessage(genl) = parsed.payload else {
            panic!("not a generic netlink message");
        };
        genl.payload
    }

    #[test]
    fn a_peer_carries_key_psk_endpoint_subnet_and_keepalive() {
        let sent = device_message(
            "flannel-wg",
            &settings(true),
            false,
            vec![peer(&spec(2), &settings(true))],
        );
        let got = on_the_wire(sent.clone());
        assert_eq!(got, sent);
        assert_eq!(got.cmd, WireguardCmd::SetDevice);
        let key = PrivateKey::from_base64(PRIVATE).unwrap();
        assert_eq!(
            got.attributes[..3],
            [
                WireguardAttribute::IfName("flannel-wg".into()),
                WireguardAttribute::PrivateKey(*key.to_bytes()),
                WireguardAttribute::ListenPort(51820),
            ]
        );
        let WireguardAttribute::Peers(peers) = &got.attributes[3] else {
            panic!("no peers in {got:?}");
        };
        let want = [
            WireguardPeerAttribute::PublicKey([2; 32]),
            WireguardPeerAttribute::Flags(WireguardPeerFlags::ReplaceAllowedIps),
            WireguardPeerAttribute::PresharedKey(*PresharedKey::from_base64(PSK).unwrap().bytes()),
            WireguardPeerAttribute::Endpoint("10.200.0.2:51820".parse().unwrap()),
            WireguardPeerAttribute::PersistentKeepalive(25),
            WireguardPeerAttribute::AllowedIps(vec![WireguardAllowedIp(vec![
                WireguardAllowedIpAttr::Family(WireguardAddressFamily::Ipv4),
                WireguardAllowedIpAttr::IpAddr("10.5.2.0".parse().unwrap()),
                WireguardAllowedIpAttr::Cidr(24),
            ])]),
        ];
        assert_eq!(peers[..], [WireguardPeer(want.to_vec())]);
        let without_psk = peer(&spec(2), &settings(false));
        assert!(!format!("{without_psk:?}").contains("PresharedKey"));
    }

    /// The allowed IPs and endpoint of the one peer of `message`, as the kernel reads them.
    fn allowed_and_endpoint(message: WireguardMessage) -> (Vec<WireguardAllowedIp>, SocketAddr) {
        let got = on_the_wire(message);
        let Some(WireguardAttribute::Peers(peers)) = got.attributes.last() else {
            panic!("no peers in {got:?}");
        };
        let (mut allowed, mut endpoint) = (None, None);
        for attribute in &peers[0].0 {
            match attribute {
                WireguardPeerAttribute::AllowedIps(ips) => allowed = Some(ips.clone()),
                WireguardPeerAttribute::Endpoint(at) => endpoint = Some(*at),
                _ => {}
            }
        }
        (allowed.unwrap(), endpoint.unwrap())
    }

    #[test]
    fn a_dual_stack_peer_carries_the_subnets_of_the_families_its_device_carries() {
        let dual = WgPeerSpec {
            subnet6: Some("fd10:0:0:2::/64".parse().unwrap()),
            endpoint: "[fd00:200::2]:51821".parse().unwrap(),
            ..spec(2)
        };
        let v4 = allowed(
            WireguardAddressFamily::Ipv4,
            "10.5.2.0".parse().unwrap(),
            24,
        );
        let v6 = allowed(
            WireguardAddressFamily::Ipv6,
            "fd10:0:0:2::".parse().unwrap(),
            64,
        );
        for (families, port, want) in [
            // Modes auto, ipv4 and ipv6: one device, both families.
            (Families::Both, 51820, vec![v4.clone(), v6.clone()]),
            // Mode separate: flannel-wg, and flannel-wg-v6 at ListenPortV6.
            (Families::Ipv4, 51820, vec![v4]),
            (Families::Ipv6, 51821, vec![v6]),
        ] {
            let settings = DeviceSettings {
                families,
                listen_port: port,
                ..settings(false)
            };
            let name = "flannel-wg-v6";
            let message = device_message(name, &settings, false, vec![peer(&dual, &settings)]);
            assert!(message
                .attributes
                .contains(&WireguardAttribute::ListenPort(port)));
            let (got, endpoint) = allowed_and_endpoint(message);
            assert_eq!(got, want, "{families:?}");
            assert_eq!(endpoint, dual.endpoint, "an IPv6 endpoint crosses as one");
        }
    }

    #[test]
    fn a_rekeyed_peer_removes_the_old_key_first() {
        let removal = on_the_wire(device_message(
            "flannel-wg",
            &settings(false),
            false,
            vec![removal(&PublicKey([9; 32]))],
        ));
        let WireguardAttribute::Peers(peers) = &removal.attributes[3] else {
            panic!("no peers in {removal:?}");
        };
        assert_eq!(
            peers[0].0,
            [
                WireguardPeerAttribute::PublicKey([9; 32]),
                WireguardPeerAttribute::Flags(WireguardPeerFlags::RemoveMe),
            ]
        );
    }

    #[test]
    fn replacing_many_peers_takes_several_messages_and_only_the_first_replaces() {
        let specs: Vec<WgPeerSpec> = (1..=70).map(spec).collect();
        let messages = replace_messages("flannel-wg", &settings(false), &specs);
        assert_eq!(messages.len(), 3);
        let replaces = |m: &WireguardMessage| {
            m.attributes.contains(&WireguardAttribute::Flags(
                WireguardDeviceFlags::ReplacePeers,
            ))
        };
        assert!(replaces(&messages[0]));
        assert!(!replaces(&messages[1]) && !replaces(&messages[2]));
        let counted: usize = messages
            .into_iter()
            .map(on_the_wire)
            .flat_map(|m| m.attributes)
            .map(|a| match a {
                WireguardAttribute::Peers(p) => p.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(counted, 70);
        let empty = replace_messages("flannel-wg", &settings(false), &[]);
        assert_eq!(empty.len(), 1);
        assert!(replaces(&empty[0]));
    }
}
