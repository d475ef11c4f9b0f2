//! A veth underlay is no wire: it hands the other namespace what this one's stack made, TCP
//! super-packets whole and checksums still to be filled in. A TUN node or flanneld on the other
//! end reads them from its socket as they are: a 64 KB datagram, an inner TCP checksum never
//! filled in, which its kernel drops. A NIC, or the kernel for a NIC without the offload,
//! segments and checksums at transmit; on a veth underlay the eBPF dataplane has the kernel do
//! that: transmit checksumming off, and TSO with it (docs/decisions.md, "A veth underlay is
//! not a wire").

use crate::device;
use anyhow::Context;

/// Whether `underlay`'s driver is veth (`ethtool -i`), the underlay this module is about.
pub fn is_veth(underlay: &str) -> anyhow::Result<bool> {
    let driver = device::driver(underlay).with_context(|| format!("on {underlay}"))?;
    Ok(driver == "veth")
}

/// Make `underlay` segment and checksum at transmit if it is a veth.
pub(crate) fn like_a_wire(underlay: &str) -> anyhow::Result<()> {
    if !is_veth(underlay)? {
        return Ok(());
    }
    if device::checksum_in_software(underlay).with_context(|| format!("on {underlay}"))? {
        tracing::info!(
            device = underlay,
            "a veth underlay: transmit checksumming (and TSO) off, so that what leaves is \
             segmented and checksummed as a NIC sends it"
        );
    }
    Ok(())
}
