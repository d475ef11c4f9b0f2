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
        let socket = nix::sys::socket::socket(
            nix::sys::socket::AddressFamily::Inet,
            nix::sys::socket::SockType::Datagram,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
            None,
        )
        .context("opening a socket for device ioctls")?;
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
    // SAFETY: `req` is a valid ifreq that outlives the call; the request reads and writes it.
    if unsafe { libc::ioctl(socket.as_raw_fd(), request, &mut req) } < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("ioctl on {name}"));
    }
    Ok(req)
}
