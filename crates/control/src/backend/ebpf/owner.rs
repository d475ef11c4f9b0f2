//! Which running twill owns an eBPF dataplane's device. Nothing holds a dummy device open the
//! way a process holds a TUN, so a running eBPF node claims its device with a listening
//! socket of an abstract name made from the device's: abstract names live in the network
//! namespace, as devices do, and the kernel frees the name when the process ends, however it
//! ends. A second node, or a cleanup, finds the name taken and learns the owner's pid from it
//! (SO_PEERCRED). The pins are claimed apart, by their directory (`twill_ebpf::Dataplane`).

use anyhow::Context;
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use std::io::ErrorKind;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};

/// The claim of a running node on its device; the device is free again when it is dropped.
#[derive(Debug)]
pub struct Owner {
    _socket: UnixListener,
}

/// Another running twill owns the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The owner's pid, if it could be asked.
    pub pid: Option<i32>,
}

impl std::fmt::Display for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.pid {
            Some(pid) => write!(f, "a running twill (pid {pid})"),
            None => write!(f, "a running twill"),
        }
    }
}

impl Owner {
    /// Claims `device` in this network namespace. `Ok(Err(held))` while another twill has it.
    pub fn claim(device: &str) -> anyhow::Result<Result<Owner, Held>> {
        let address = address(device)?;
        match UnixListener::bind_addr(&address) {
            Ok(socket) => Ok(Ok(Owner { _socket: socket })),
            Err(e) if e.kind() == ErrorKind::AddrInUse => Ok(Err(Held {
                pid: owner_pid(&address),
            })),
            Err(e) => Err(e).with_context(|| format!("cannot claim the eBPF device {device}")),
        }
    }
}

/// The abstract name of `device`'s claim.
fn address(device: &str) -> anyhow::Result<SocketAddr> {
    let name = format!("twill/ebpf/{device}");
    SocketAddr::from_abstract_name(name.as_bytes())
        .with_context(|| format!("no socket name for the device {device:?}"))
}

/// The pid of the process listening at `address`, as the kernel recorded it at listen().
fn owner_pid(address: &SocketAddr) -> Option<i32> {
    let stream = UnixStream::connect_addr(address).ok()?;
    let credentials = getsockopt(&stream, PeerCredentials).ok()?;
    Some(credentials.pid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_has_one_owner_at_a_time_and_the_next_learns_its_pid() {
        let device = format!("t{}", std::process::id());
        let first = Owner::claim(&device).unwrap().unwrap();
        let held = Owner::claim(&device).unwrap().unwrap_err();
        assert_eq!(held.pid, Some(std::process::id() as i32));
        assert_eq!(
            held.to_string(),
            format!("a running twill (pid {})", std::process::id())
        );
        let other = Owner::claim(&format!("{device}x")).unwrap();
        assert!(other.is_ok(), "another device is free");
        drop(first);
        assert!(Owner::claim(&device).unwrap().is_ok(), "free once dropped");
    }
}
