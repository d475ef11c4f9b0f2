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

/// ETHTOOL_GGRO and ETHTOOL_SGRO (linux/ethtool.h), which libc does not name.
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
    let socket = device_socket()?;
    let mut value = EthtoolValue {
        cmd: ETHTOOL_GGRO,
        data: 0,
    };
    ethtool(&socket, name, &mut value).context("reading whether GRO is on")?;
    if value.data != 0 {
        return Ok(false);
    }
    value = EthtoolValue {
        cmd: ETHTOOL_SGRO,
        data: 1,
    };
    ethtool(&socket, name, &mut value).context("turning GRO on")?;
    Ok(true)
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
