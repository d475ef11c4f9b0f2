//! Whether the underlay is a veth, which is no wire: it hands the other namespace what this
//! one's stack made, TCP super-packets whole and checksums still to be filled in. A NIC, or
//! the kernel for a NIC without the offload, segments and checksums at transmit. On a veth
//! underlay the dataplane runs the segmenter (crate::segmenter) for the peers that need that.

use crate::device;
use anyhow::Context;

/// Whether `underlay`'s driver is veth (`ethtool -i`).
pub fn is_veth(underlay: &str) -> anyhow::Result<bool> {
    let driver = device::driver(underlay).with_context(|| format!("on {underlay}"))?;
    Ok(driver == "veth")
}
