//! The eBPF dataplane on one node: the programs attached to twill's device and the underlay,
//! and the peers in their maps.

use crate::attach::{self, AttachMode, Attached, Hook};
use crate::counters::Counters;
use crate::device::Device;
use crate::loaded::{Loaded, TestOutput};
use crate::maps::{wire_addr, wire_port, Config};
use crate::object::{self, Side};
use crate::peers::Takes;
use crate::pins;
use crate::segmenter::Segmenter;
use crate::xdp::{self, Ingress, XdpChoice};
use anyhow::{ensure, Context};
use aya::programs::ProgramInfo;
use ipnet::{Ipv4Net, Ipv6Net};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use twill_dataplane::icmp_limit::IcmpLimit;

/// Where the programs run and what they put on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// twill's dummy device, to which the flannel network is routed (e.g. flannel0).
    pub device: String,
    /// The underlay interface the node's datagrams come in on (`--iface`).
    pub underlay: String,
    /// The node's underlay address: the outer source, and the address datagrams must be for.
    pub local_ip: Ipv4Addr,
    /// Over the IPv6 underlay (`Backend.Underlay` "ipv6"), the node's IPv6 underlay address,
    /// which then takes `local_ip`'s place; peers are set with IPv6 endpoints.
    pub local_ip6: Option<Ipv6Addr>,
    /// flannel's udp port (`Backend.Port`, 8285 by default): outer source and destination.
    pub port: u16,
    /// tcx links or classic TC filters (`--bpf-attach`).
    pub attach: AttachMode,
    /// Whether to decapsulate at XDP on the underlay (else at TC).
    pub xdp: XdpChoice,
    /// Pass what peers that read from a socket take, and trains of datagrams, through a
    /// segmenter (crate::segmenter): for an underlay that is or sits on a veth
    /// ([`crate::veth_under`]).
    pub segmenter: bool,
    /// The device's own addresses (the lease's network address, and its IPv6 one on a
    /// dual-stack network): where the ICMP errors the programs answer with come from. None:
    /// that family's drops are not answered.
    pub device_ip: Option<Ipv4Addr>,
    pub device_ip6: Option<Ipv6Addr>,
    /// How many of those errors may go (the kernel's limit in the node's namespace).
    pub icmp_limit: IcmpLimit,
}

impl Attachment {
    /// The device each program runs on.
    fn device_of(&self, side: Side) -> String {
        match side {
            Side::Egress => self.device.clone(),
            Side::Ingress => self.underlay.clone(),
            Side::Segmented => Segmenter::of(&self.device).receive,
        }
    }

    /// The programs this attachment runs at TC.
    fn sides(&self) -> &'static [Side] {
        match self.segmenter {
            true => &Side::ALL,
            false => &Side::BOTH,
        }
    }
}

/// What [`Dataplane::open`] found in its pin directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// Nothing (or not all of it): the programs were attached now.
    Fresh,
    /// An earlier run's programs were attached and kept running (or were swapped for this
    /// build's in one step); its maps hold `peers` peers, to be reconciled with the leases.
    Adopted { peers: usize },
}

/// The attached programs and their maps. Dropping it leaves them running (they are pinned);
/// [`crate::remove`] takes them away, or [`Dataplane::remove`] what this one made.
pub struct Dataplane {
    loaded: Mutex<Loaded>,
    /// The claim on the pin directory, taken again when the dataplane is opened again.
    claim: Mutex<Option<pins::PinLock>>,
    pin_dir: PathBuf,
    at: Attachment,
    hook: Hook,
    running: Mutex<Running>,
    /// The twill device's ifindex when the programs were attached: a device made again has
    /// another, and none of the attachments of the old one.
    device_ifindex: AtomicU32,
}

impl Dataplane {
    /// Attach the programs as `at` says, pinning programs, links and maps under `pin_dir` (a
    /// bpffs is mounted there if it is not on one). What an earlier run pinned there is
    /// adopted: its maps with their peers and counters, its links without a gap. Refused while
    /// another running dataplane holds `pin_dir`; what this call pinned is unpinned again when
    /// it fails half-way.
    pub fn open(pin_dir: &Path, at: &Attachment) -> anyhow::Result<(Dataplane, Opened)> {
        let hook = at.attach.hook()?;
        let (ready, claim) = attach_at(pin_dir, at, hook)?;
        let dataplane = Dataplane {
            loaded: Mutex::new(ready.loaded),
            claim: Mutex::new(Some(claim)),
            pin_dir: pin_dir.to_path_buf(),
            at: at.clone(),
            hook,
            running: Mutex::new(ready.running),
            device_ifindex: AtomicU32::new(ready.device_ifindex),
        };
        Ok((dataplane, ready.opened))
    }

    /// Attach again what someone took away while this dataplane ran (its device deleted and
    /// made again, its pins removed): with the pins still there it adopts them, as a restart
    /// does; else it starts with fresh maps, which the caller fills again.
    pub fn reopen(&self) -> anyhow::Result<Opened> {
        let mut claim = self.claim.lock().unwrap_or_else(|e| e.into_inner());
        // The directory may be a new one: the old claim goes before the new is taken.
        drop(claim.take());
        let (ready, new_claim) = attach_at(&self.pin_dir, &self.at, self.hook)?;
        *self.lock() = ready.loaded;
        *self.running() = ready.running;
        *claim = Some(new_claim);
        self.device_ifindex
            .store(ready.device_ifindex, Ordering::Relaxed);
        Ok(ready.opened)
    }

    /// How the programs are attached: tcx links or classic TC filters.
    pub fn hook(&self) -> Hook {
        self.hook
    }

    /// Where the underlay's datagrams are decapsulated, and if not at XDP, why.
    pub fn ingress(&self) -> Ingress {
        self.running().ingress.clone()
    }

    /// What this kernel lacks or refused that the node runs without (tcx links, the XDP
    /// program), a line each naming it and what does its job; empty where it runs whole.
    pub fn left_out(&self) -> Vec<String> {
        self.running().left_out.clone()
    }

    fn running(&self) -> MutexGuard<'_, Running> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the programs still run where they were attached: false once the device was
    /// deleted (and made again), the pins (and with them the links) removed, a filter
    /// deleted, or the segmenter's sending end made to checksum in hardware again (it would
    /// then hand TUN peers super-packets whole).
    pub fn intact(&self) -> anyhow::Result<bool> {
        let now = nix::net::if_::if_nametoindex(self.at.device.as_str()).ok();
        if now != Some(self.device_ifindex.load(Ordering::Relaxed)) {
            return Ok(false);
        }
        let running = self.running().clone();
        for (side, id) in running.tc {
            if !attach::runs(id, side, &self.at.device_of(side), self.hook)? {
                return Ok(false);
            }
        }
        if self.at.segmenter
            && !crate::device::checksums_in_software(&Segmenter::of(&self.at.device).send)?
        {
            return Ok(false);
        }
        match running.xdp {
            Some(id) => xdp::runs(id, &self.at.underlay),
            None => Ok(true),
        }
    }

    /// Detach and unpin everything, for a start that failed after this dataplane was opened
    /// fresh: what it made goes with it.
    pub fn remove(self) -> anyhow::Result<()> {
        let Dataplane {
            loaded,
            claim,
            pin_dir,
            at,
            running,
            ..
        } = self;
        drop(loaded);
        let removed = crate::cleanup::remove_pins(&pin_dir);
        drop(claim);
        let made = running.into_inner().unwrap_or_else(|e| e.into_inner());
        if made.segmenter_created {
            Segmenter::of(&at.device).remove()?;
        }
        removed
    }

    /// Route `subnet` (and `subnet6`, the peer's IPv6 subnet on a dual-stack network) to the
    /// peer at `endpoint`, whose node `takes` what it takes, and accept its datagrams; changes
    /// the peer of `subnet` if any of that changed. Refused when another subnet's peer has that
    /// address or that IPv6 subnet.
    pub fn set_peer(
        &self,
        subnet: Ipv4Net,
        subnet6: Option<Ipv6Net>,
        endpoint: impl Into<SocketAddr>,
        takes: Takes,
    ) -> anyhow::Result<()> {
        let mut loaded = self.lock();
        let Loaded { maps, peers, .. } = &mut *loaded;
        peers.set(maps, subnet, subnet6, endpoint.into(), takes)
    }

    /// Forget the peer of `subnet` (none is fine).
    pub fn remove_peer(&self, subnet: Ipv4Net) -> anyhow::Result<()> {
        let mut loaded = self.lock();
        let Loaded { maps, peers, .. } = &mut *loaded;
        peers.remove(maps, subnet)
    }

    /// The peers in the maps, by subnet.
    pub fn peers(&self) -> anyhow::Result<Vec<(Ipv4Net, SocketAddr)>> {
        Ok(self.lock().peers.list())
    }

    /// What each peer's node takes, by the peer's subnet.
    pub fn peers_take(&self) -> BTreeMap<Ipv4Net, Takes> {
        self.lock().peers.takes()
    }

    /// The IPv6 subnets of the peers that have one, by the peer's IPv4 subnet.
    pub fn peer_subnets6(&self) -> BTreeMap<Ipv4Net, Ipv6Net> {
        self.lock().peers.subnets6()
    }

    pub fn counters(&self) -> anyhow::Result<Counters> {
        self.lock().counters()
    }

    /// The totals and drops without the per-peer traffic (`peers` is empty): what /metrics
    /// needs, at the cost of a few map reads however many peers there are.
    pub fn totals(&self) -> anyhow::Result<Counters> {
        self.lock().totals()
    }

    /// Run one of the attached programs on a crafted Ethernet frame (BPF_PROG_TEST_RUN), with
    /// the real maps and counters; nothing is sent.
    pub fn test_run(&self, side: Side, frame: &[u8]) -> anyhow::Result<TestOutput> {
        self.lock().test_run(side, frame)
    }

    /// [`Dataplane::test_run`] for the XDP ingress program (loaded now if it was not: it is
    /// loaded only to be attached); an error naming the verifier's reason where the kernel
    /// refuses it.
    pub fn test_run_xdp(&self, frame: &[u8]) -> anyhow::Result<TestOutput> {
        self.lock().test_run_xdp(frame)
    }

    fn lock(&self) -> MutexGuard<'_, Loaded> {
        // A panic while holding the lock left no half-made change that matters more than
        // the maps themselves, which stay the truth.
        self.loaded.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl std::fmt::Debug for Dataplane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataplane").finish_non_exhaustive()
    }
}

/// What runs where after an attach: the ids of the programs in the hooks (an adopted one is an
/// earlier run's, not the one loaded now), and where the underlay's datagrams are decapsulated.
#[derive(Debug, Clone)]
struct Running {
    tc: Vec<(Side, u32)>,
    xdp: Option<u32>,
    ingress: Ingress,
    /// The segmenter was made by this attach (a failed start takes it back).
    segmenter_created: bool,
    /// What this kernel lacks or refused that the node runs without, a line each.
    left_out: Vec<String>,
}

/// What a node runs without on this kernel: tcx links where `auto` found none (classic TC
/// filters do the same job), the XDP program where the kernel refused it (TC decapsulates).
fn left_out(hook: Hook, mode: AttachMode, xdp_refused: Option<String>) -> Vec<String> {
    let tcx = (mode == AttachMode::Auto && hook == Hook::Tc).then(|| {
        format!(
            "tcx links (Linux 6.6+; kernel {}): attached by classic TC filters",
            crate::probe::kernel_release()
        )
    });
    let xdp = xdp_refused.map(|why| format!("XDP ingress: {why}; decapsulated at TC"));
    tcx.into_iter().chain(xdp).collect()
}

/// The id of the program pinned at `pin`: the one that runs in its hook.
fn pinned_id(pin: &Path) -> anyhow::Result<u32> {
    let info = ProgramInfo::from_pin(pin).with_context(|| format!("reading {}", pin.display()))?;
    Ok(info.id())
}

/// What [`attach_at`] made or found.
struct Ready {
    loaded: Loaded,
    opened: Opened,
    running: Running,
    device_ifindex: u32,
}

/// Claims `pin_dir` (a bpffs mounted there if needed), loads the object on the maps pinned
/// there and attaches the programs; on a failure where nothing was pinned before, unpins what
/// it pinned and removes the segmenter.
fn attach_at(
    pin_dir: &Path,
    at: &Attachment,
    hook: Hook,
) -> anyhow::Result<(Ready, pins::PinLock)> {
    ensure!(at.port != 0, "the eBPF dataplane's port must not be 0");
    ensure!(
        !at.local_ip.is_unspecified(),
        "the eBPF dataplane's local_ip must be the node's underlay address, not 0.0.0.0"
    );
    let device = Device::lookup(&at.device)?;
    let underlay = Device::lookup(&at.underlay)?;
    pins::ensure_bpffs(pin_dir)?;
    let claim = pins::lock(pin_dir)?;
    let had_pins = pins::pinned_config(pin_dir).is_ok_and(|c| c.is_some());
    match load_and_attach(pin_dir, at, hook, device, underlay) {
        Ok(attached) => Ok((attached, claim)),
        Err(e) if had_pins => Err(e),
        Err(e) => {
            if let Err(left) = crate::cleanup::remove_pins(pin_dir) {
                tracing::warn!("removing the pins of a failed start: {left:#}");
            }
            if at.segmenter {
                if let Err(left) = Segmenter::of(&at.device).remove() {
                    tracing::warn!("removing the segmenter of a failed start: {left:#}");
                }
            }
            Err(e)
        }
    }
}

fn load_and_attach(
    pin_dir: &Path,
    at: &Attachment,
    hook: Hook,
    device: Device,
    underlay: Device,
) -> anyhow::Result<Ready> {
    let mut loaded = Loaded::load(Some(pin_dir), at.sides())?;
    let segmenter = match at.segmenter {
        true => Some(Segmenter::of(&at.device).ensure(underlay.mtu)?),
        false => None,
    };
    loaded
        .maps
        .write_segmenter(segmenter.map(|s| s.send.ifindex))?;
    loaded.maps.write_config(Config {
        local_ip: wire_addr(at.local_ip),
        underlay_ifindex: underlay.ifindex,
        device_ifindex: device.ifindex,
        port: wire_port(at.port),
        mtu: device.mtu,
        device_mac: device.mac,
        pad: [0; 2],
    })?;
    loaded.maps.write_config6(at.local_ip6)?;
    loaded.maps.write_own_addrs(at.device_ip, at.device_ip6)?;
    loaded.maps.write_icmp_limit(at.icmp_limit)?;
    let mut adopted = true;
    let mut tc = Vec::new();
    for &side in at.sides() {
        let program = object::program(&mut loaded.ebpf, side)?;
        let attached = attach::attach(program, side, &at.device_of(side), pin_dir, hook)?;
        // A segmenter made now has nothing of an earlier run's to adopt.
        adopted &= attached != Attached::New || side == Side::Segmented;
        tc.push((side, pinned_id(&pins::program_pin(pin_dir, side))?));
    }
    if !at.segmenter {
        // An earlier run's on a veth underlay, this one's on another.
        attach::unpin(&pins::link_pin(pin_dir, Side::Segmented))?;
        attach::unpin(&pins::program_pin(pin_dir, Side::Segmented))?;
    }
    let xdp_wanted = match at.xdp {
        XdpChoice::Auto if at.segmenter => Err(format!(
            "the underlay {} is a veth, whose peer would segment every super-packet for XDP \
             (--bpf-xdp on attaches it anyway)",
            at.underlay
        )),
        XdpChoice::Auto | XdpChoice::On => Ok(()),
        XdpChoice::Off => Err("XDP was not asked for (--bpf-xdp off)".to_string()),
    };
    // Loaded only where it would be attached: a kernel that refuses it (6.18.44-fc refuses
    // bpf_xdp_adjust_meta to it) costs the node XDP alone.
    let (xdp_wanted, xdp_refused) = match xdp_wanted {
        Ok(()) => match loaded.load_xdp()? {
            Ok(()) => (Ok(()), None),
            Err(why) => (Err(why.clone()), Some(why)),
        },
        Err(why) => (Err(why), None),
    };
    // After twill_ingress, which moves what this program decapsulated into the device.
    let (xdp, ingress) = match xdp_wanted {
        Ok(()) => match xdp::attach(
            object::xdp_program(&mut loaded.ebpf)?,
            &at.underlay,
            pin_dir,
        )? {
            Ok(attached) => {
                adopted &= attached != Attached::New;
                (
                    Some(pinned_id(&pins::xdp_program_pin(pin_dir))?),
                    Ingress::Xdp,
                )
            }
            Err(why) => (None, Ingress::Tc { why }),
        },
        Err(why) => {
            xdp::detach(pin_dir)?;
            (None, Ingress::Tc { why })
        }
    };
    let opened = match adopted {
        true => Opened::Adopted {
            peers: loaded.peers.len(),
        },
        false => Opened::Fresh,
    };
    Ok(Ready {
        loaded,
        opened,
        running: Running {
            tc,
            xdp,
            ingress,
            segmenter_created: segmenter.is_some_and(|s| s.created),
            left_out: left_out(hook, at.attach, xdp_refused),
        },
        device_ifindex: device.ifindex,
    })
}
