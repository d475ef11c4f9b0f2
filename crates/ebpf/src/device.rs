//! What the programs must know of a device, read in the calling thread's network namespace
//! (/sys may show another one's).

use anyhow::{bail, Context};
use std::os::fd::{AsRawFd, OwnedFd};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Device {
    pub ifindex: u32,
    pub mac: [u8; 6],
    pub mtu: u16,
}

impl Device {
    pub fn lookup(name: &str) -> anyhow::Result<Device> {
        let ifindex = nix::net::if_::if_nametoindex(name)
            .with_context(|| format!("no device {name} in this network namespace"))?;
        let socket = device_socket()?;
        let hwaddr = ifreq(&socket, name, libc::SIOCGIFHWADDR)?;
        let mtu = ifreq(&socket, name, libc::SIOCGIFMTU)?;
        // SAFETY: the kernel filled the union member that each request names.
        let (data, mtu) = unsafe { (hwaddr.ifr_ifru.ifru_hwaddr.sa_data, mtu.ifr_ifru.ifru_mtu) };
        let mac = std::array::from_fn(|i| data[i] as u8);
        let mtu =
            u16::try_from(mtu).with_context(|| format!("{name}'s MTU {mtu} is out of range"))?;
        Ok(Device { ifindex, mac, mtu })
    }
}

fn ifreq(socket: &OwnedFd, name: &str, request: libc::Ioctl) -> anyhow::Result<libc::ifreq> {
    let mut req = named_ifreq(name)?;
    ioctl(socket, name, request, &mut req)?;
    Ok(req)
}

fn named_ifreq(name: &str) -> anyhow::Result<libc::ifreq> {
    // SAFETY: ifreq is plain data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= req.ifr_name.len() {
        bail!(
            "device name {name:?} is longer than {} bytes",
            req.ifr_name.len() - 1
        );
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    Ok(req)
}

fn ioctl(
    socket: &OwnedFd,
    name: &str,
    request: libc::Ioctl,
    req: &mut libc::ifreq,
) -> anyhow::Result<()> {
    // SAFETY: `req` is a valid ifreq that outlives the call, and whatever its ifr_data points
    // to outlives the call too; the request reads and writes them.
    if unsafe { libc::ioctl(socket.as_raw_fd(), request, req as *mut libc::ifreq) } < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("ioctl on {name}"));
    }
    Ok(())
}

/// ethtool's commands (linux/ethtool.h), which libc does not name.
const ETHTOOL_GDRVINFO: u32 = 0x03;
const ETHTOOL_GTXCSUM: u32 = 0x16;
const ETHTOOL_STXCSUM: u32 = 0x17;
const ETHTOOL_GGRO: u32 = 0x2b;
const ETHTOOL_SGRO: u32 = 0x2c;

/// `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// Turns GRO on for `name` if it is off, as `ethtool -K name gro on` does; true when it was
/// off. A veth has it off, and since Linux 6.6 attaching XDP no longer turns it on: without it
/// the segments the XDP program decapsulates reach the stack one by one.
pub(crate) fn ensure_gro(name: &str) -> anyhow::Result<bool> {
    set_feature(name, (ETHTOOL_GGRO, ETHTOOL_SGRO), true).context("turning GRO on")
}

/// Turns transmit checksumming off for `name` if it is on (TSO goes with it), as `ethtool -K
/// name tx off` does; true when it was on.
pub(crate) fn checksum_in_software(name: &str) -> anyhow::Result<bool> {
    set_feature(name, (ETHTOOL_GTXCSUM, ETHTOOL_STXCSUM), false)
        .context("turning transmit checksumming off")
}

/// Whether transmit checksumming is off on `name` (what [`checksum_in_software`] makes it, and
/// what an older twill's veth rule left on its underlay).
pub fn checksums_in_software(name: &str) -> anyhow::Result<bool> {
    let on = feature(&device_socket()?, name, ETHTOOL_GTXCSUM)
        .context("reading transmit checksumming")?;
    Ok(!on)
}

/// Whether the feature the `get` command reads is on.
fn feature(socket: &OwnedFd, name: &str, get: u32) -> anyhow::Result<bool> {
    let mut value = EthtoolValue { cmd: get, data: 0 };
    ethtool(socket, name, &mut value)?;
    Ok(value.data != 0)
}

/// Sets the feature that the (get, set) commands read and write to `on`; true when it changed.
fn set_feature(name: &str, (get, set): (u32, u32), on: bool) -> anyhow::Result<bool> {
    let socket = device_socket()?;
    if feature(&socket, name, get)? == on {
        return Ok(false);
    }
    let mut value = EthtoolValue {
        cmd: set,
        data: u32::from(on),
    };
    ethtool(&socket, name, &mut value)?;
    Ok(true)
}

/// The name of `name`'s driver, as `ethtool -i` gives it (`veth`, `virtio_net`, ...).
pub(crate) fn driver(name: &str) -> anyhow::Result<String> {
    // struct ethtool_drvinfo: cmd, then driver[32] and more this does not read.
    let mut info = [0u32; 49];
    info[0] = ETHTOOL_GDRVINFO;
    let mut req = named_ifreq(name)?;
    req.ifr_ifru.ifru_data = info.as_mut_ptr().cast();
    ioctl(&device_socket()?, name, libc::SIOCETHTOOL, &mut req)
        .context("reading the driver's name")?;
    let bytes: Vec<u8> = info[1..9].iter().flat_map(|w| w.to_ne_bytes()).collect();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
}

fn ethtool(socket: &OwnedFd, name: &str, value: &mut EthtoolValue) -> anyhow::Result<()> {
    let mut req = named_ifreq(name)?;
    req.ifr_ifru.ifru_data = (value as *mut EthtoolValue).cast();
    ioctl(socket, name, libc::SIOCETHTOOL, &mut req)
}

fn device_socket() -> anyhow::Result<OwnedFd> {
    nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .context("opening a socket for device ioctls")
}
