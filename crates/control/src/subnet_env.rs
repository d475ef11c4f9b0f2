//! flannel's subnet.env (default `/run/flannel/subnet.env`).
//!
//! Container runtimes and CNI plugins source this file (`docker --bip=$FLANNEL_SUBNET
//! --mtu=$FLANNEL_MTU`), so it must carry flannel's variables in flannel's format. It is also
//! twill's memory across restarts: the subnet in it is preferred when acquiring a lease, which
//! keeps a node's subnet stable (flannel #205).

use crate::small_file;
use anyhow::{bail, Context};
use ipnet::{Ipv4Net, Ipv6Net};
use std::fs;
use std::io::{ErrorKind, Write};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// flanneld's default `--subnet-file`.
pub const DEFAULT_PATH: &str = "/run/flannel/subnet.env";

/// The contents of subnet.env.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetEnv {
    /// `FLANNEL_NETWORK` and `FLANNEL_SUBNET`, on a network with IPv4 (all but IPv6-only).
    pub ipv4: Option<Ipv4Env>,
    /// `FLANNEL_MTU`: the MTU containers should use.
    pub mtu: u32,
    /// `FLANNEL_IPMASQ`: whether the daemon masquerades traffic leaving the network.
    pub ipmasq: bool,
    /// A dual-stack node's `FLANNEL_IPV6_NETWORK` and `FLANNEL_IPV6_SUBNET`.
    pub ipv6: Option<Ipv6Env>,
}

/// The IPv4 variables of subnet.env, as flanneld writes them when `EnableIPv4` is true.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv4Env {
    /// `FLANNEL_NETWORK`: the whole container network.
    pub network: Ipv4Net,
    /// This node's lease. Written as its first host address (`10.5.8.1/24`), as flannel does,
    /// because that is the bridge address the runtime should use.
    pub subnet: Ipv4Net,
}

/// The IPv6 variables of subnet.env, as flanneld writes them when `EnableIPv6` is true.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv6Env {
    /// `FLANNEL_IPV6_NETWORK`: the whole IPv6 container network.
    pub network: Ipv6Net,
    /// This node's IPv6 subnet, written as its first host address (`fd10:0:0:8::1/64`).
    pub subnet: Ipv6Net,
}

impl SubnetEnv {
    /// The file's text, line for line what flanneld writes: the IPv4 lines and the IPv6 ones,
    /// each where the network has that family, then MTU and masquerading.
    pub fn render(&self) -> String {
        let mut text = String::new();
        if let Some(v4) = &self.ipv4 {
            text += &format!(
                "FLANNEL_NETWORK={}\nFLANNEL_SUBNET={}/{}\n",
                v4.network,
                first_host(v4.subnet),
                v4.subnet.prefix_len(),
            );
        }
        if let Some(v6) = &self.ipv6 {
            text += &format!(
                "FLANNEL_IPV6_NETWORK={}\nFLANNEL_IPV6_SUBNET={}/{}\n",
                v6.network,
                first_host_v6(v6.subnet),
                v6.subnet.prefix_len()
            );
        }
        text + &format!("FLANNEL_MTU={}\nFLANNEL_IPMASQ={}\n", self.mtu, self.ipmasq)
    }

    /// Parses the file's text. Unknown variables are ignored; the IPv4 ones are read when
    /// `FLANNEL_SUBNET` is there, the IPv6 ones when `FLANNEL_IPV6_SUBNET` is; one of them must be.
    pub fn parse(text: &str) -> anyhow::Result<SubnetEnv> {
        let vars = Vars::parse(text);
        let env = SubnetEnv {
            ipv4: ipv4_of(&vars)?,
            mtu: vars.value("FLANNEL_MTU")?,
            ipmasq: vars.value("FLANNEL_IPMASQ")?,
            ipv6: ipv6_of(&vars)?,
        };
        if env.ipv4.is_none() && env.ipv6.is_none() {
            bail!("FLANNEL_SUBNET and FLANNEL_IPV6_SUBNET are both missing");
        }
        Ok(env)
    }

    /// Writes the file atomically: readers see the old file or the new one, never a torn one,
    /// even if the daemon is killed half-way. The directory is created if needed and an existing
    /// file keeps its permissions, as flanneld does.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        write_atomically(path, self.render().as_bytes())
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Reads the file; `Ok(None)` when it does not exist (first start).
    pub fn read(path: &Path) -> anyhow::Result<Option<SubnetEnv>> {
        read_text(path)?
            .map(|text| {
                SubnetEnv::parse(&text).with_context(|| format!("reading {}", path.display()))
            })
            .transpose()
    }
}

/// The subnets a previous run leased, from FLANNEL_SUBNET (and FLANNEL_IPV6_SUBNET, on a
/// dual-stack node) alone. Lenient on purpose: a file written by another flannel version may
/// lack the other variables, and the subnets are all that lease acquisition needs.
pub fn previous_subnets(path: &Path) -> anyhow::Result<(Option<Ipv4Net>, Option<Ipv6Net>)> {
    let Some(text) = read_text(path)? else {
        return Ok((None, None));
    };
    let vars = Vars::parse(&text);
    let subnets = || -> anyhow::Result<_> {
        let v6 = ipv6_subnet_of(&vars)?;
        Ok((subnet_of(&vars)?, v6))
    };
    subnets().with_context(|| format!("reading {}", path.display()))
}

/// The most a subnet file holds: flanneld writes six short lines.
const MAX_LEN: u64 = 64 << 10;

/// The file's text; `None` when there is none. Anything but a regular file (a device, a FIFO,
/// a directory) is an error naming it, and so is a file longer than a subnet file can be.
fn read_text(path: &Path) -> anyhow::Result<Option<String>> {
    match small_file::read_text(path, MAX_LEN) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(anyhow::anyhow!("the subnet file {}: {e}", path.display())),
    }
}

fn first_host(subnet: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(subnet.network()) + 1)
}

fn first_host_v6(subnet: Ipv6Net) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(subnet.network()) + 1)
}

fn ipv4_of(vars: &Vars) -> anyhow::Result<Option<Ipv4Env>> {
    let Some(subnet) = subnet_of(vars)? else {
        return Ok(None);
    };
    Ok(Some(Ipv4Env {
        network: vars.value("FLANNEL_NETWORK")?,
        subnet,
    }))
}

fn ipv6_of(vars: &Vars) -> anyhow::Result<Option<Ipv6Env>> {
    let Some(subnet) = ipv6_subnet_of(vars)? else {
        return Ok(None);
    };
    Ok(Some(Ipv6Env {
        network: vars.value("FLANNEL_IPV6_NETWORK")?,
        subnet,
    }))
}

fn ipv6_subnet_of(vars: &Vars) -> anyhow::Result<Option<Ipv6Net>> {
    if vars.get("FLANNEL_IPV6_SUBNET").is_none() {
        return Ok(None);
    }
    let subnet: Ipv6Net = vars.value("FLANNEL_IPV6_SUBNET")?;
    Ok(Some(subnet.trunc()))
}

fn subnet_of(vars: &Vars) -> anyhow::Result<Option<Ipv4Net>> {
    let Some(value) = vars.get("FLANNEL_SUBNET") else {
        return Ok(None);
    };
    let subnet: Ipv4Net = value
        .parse()
        .with_context(|| format!("FLANNEL_SUBNET {value:?} is not an IPv4 CIDR"))?;
    Ok(Some(subnet.trunc()))
}

/// `KEY=VALUE` lines as a shell (or godotenv, which flannel uses) would read them: comments,
/// blank lines, `export` and quotes are allowed.
struct Vars(Vec<(String, String)>);

impl Vars {
    fn parse(text: &str) -> Vars {
        let vars = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter_map(|l| l.trim_start_matches("export ").split_once('='))
            .map(|(k, v)| (k.trim().to_string(), unquote(v.trim()).to_string()))
            .collect();
        Vars(vars)
    }

    /// The last assignment wins, as in a shell.
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn value<T: std::str::FromStr>(&self, key: &str) -> anyhow::Result<T> {
        let Some(value) = self.get(key) else {
            bail!("{key} is missing");
        };
        value
            .parse()
            .map_err(|_| anyhow::anyhow!("{key} has an invalid value {value:?}"))
    }
}

fn unquote(v: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(inner) = v.strip_prefix(q).and_then(|s| s.strip_suffix(q)) {
            return inner;
        }
    }
    v
}

fn write_atomically(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir)?;
    // A device or FIFO of that name is someone else's: the rename would replace it.
    let existing = match fs::metadata(path) {
        Ok(meta) => Some(meta),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    if let Some(meta) = &existing {
        small_file::check(meta, u64::MAX)?;
    }
    let mode = existing
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o644);
    let mut tmp = tempfile::Builder::new()
        .prefix(".subnet.env.")
        .tempfile_in(dir)?;
    tmp.write_all(contents)?;
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(mode))?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    // The rename is durable only once the directory entry is on disk.
    fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SubnetEnv {
        SubnetEnv {
            ipv4: Some(Ipv4Env {
                network: "10.5.0.0/16".parse().unwrap(),
                subnet: "10.5.8.0/24".parse().unwrap(),
            }),
            mtu: 1472,
            ipmasq: false,
            ipv6: None,
        }
    }

    fn dual_stack() -> SubnetEnv {
        SubnetEnv {
            ipv6: Some(Ipv6Env {
                network: "fd10::/48".parse().unwrap(),
                subnet: "fd10:0:0:8::/64".parse().unwrap(),
            }),
            ..sample()
        }
    }

    #[test]
    fn renders_flannels_dual_stack_format() {
        let want = "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.8.1/24\n\
                    FLANNEL_IPV6_NETWORK=fd10::/48\nFLANNEL_IPV6_SUBNET=fd10:0:0:8::1/64\n\
                    FLANNEL_MTU=1472\nFLANNEL_IPMASQ=false\n";
        assert_eq!(dual_stack().render(), want);
        assert_eq!(SubnetEnv::parse(want).unwrap(), dual_stack());
    }

    /// flanneld with EnableIPv4 false writes no IPv4 line at all.
    #[test]
    fn renders_flannels_ipv6_only_format() {
        let env = SubnetEnv {
            ipv4: None,
            ..dual_stack()
        };
        let want = "FLANNEL_IPV6_NETWORK=fd10::/48\nFLANNEL_IPV6_SUBNET=fd10:0:0:8::1/64\n\
                    FLANNEL_MTU=1472\nFLANNEL_IPMASQ=false\n";
        assert_eq!(env.render(), want);
        assert_eq!(SubnetEnv::parse(want).unwrap(), env);
        let neither = SubnetEnv::parse("FLANNEL_MTU=1472\nFLANNEL_IPMASQ=false\n").unwrap_err();
        assert_eq!(
            neither.to_string(),
            "FLANNEL_SUBNET and FLANNEL_IPV6_SUBNET are both missing"
        );
    }

    #[test]
    fn bad_ipv6_variables_are_named() {
        let base = "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.8.1/24\nFLANNEL_MTU=1450\n\
                    FLANNEL_IPMASQ=true\n";
        let cases = [
            (
                "FLANNEL_IPV6_SUBNET=fd10:0:0:8::1/64\n",
                "FLANNEL_IPV6_NETWORK is missing",
            ),
            (
                "FLANNEL_IPV6_NETWORK=fd10::/48\nFLANNEL_IPV6_SUBNET=10.5.8.1/24\n",
                "FLANNEL_IPV6_SUBNET has an invalid value \"10.5.8.1/24\"",
            ),
            (
                "FLANNEL_IPV6_NETWORK=banana\nFLANNEL_IPV6_SUBNET=fd10:0:0:8::1/64\n",
                "FLANNEL_IPV6_NETWORK has an invalid value \"banana\"",
            ),
        ];
        for (lines, want) in cases {
            let err = SubnetEnv::parse(&format!("{base}{lines}"))
                .unwrap_err()
                .to_string();
            assert_eq!(err, want);
        }
    }

    #[test]
    fn renders_flannels_format() {
        let want = "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.8.1/24\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=false\n";
        assert_eq!(sample().render(), want);
    }

    #[test]
    fn write_then_read_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/flannel/subnet.env");
        assert_eq!(SubnetEnv::read(&path).unwrap(), None);
        assert_eq!(previous_subnets(&path).unwrap(), (None, None));
        sample().write(&path).unwrap();
        assert_eq!(SubnetEnv::read(&path).unwrap(), Some(sample()));
        assert_eq!(
            previous_subnets(&path).unwrap(),
            (Some("10.5.8.0/24".parse().unwrap()), None)
        );
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
    }

    #[test]
    fn rewrite_replaces_whole_file_keeps_mode_and_leaves_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("subnet.env");
        fs::write(&path, "FLANNEL_SUBNET=10.5.99.1/24\nA_MUCH_LONGER_OLD_LINE=xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        sample().write(&path).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), sample().render());
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["subnet.env"]);
    }

    #[test]
    fn reads_files_of_other_flannel_versions() {
        let text = "# written by flanneld\nexport FLANNEL_NETWORK=\"10.5.0.0/16\"\nFLANNEL_SUBNET=10.5.8.1/24\n\
                    FLANNEL_IPV6_NETWORK=fc00::/48\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n";
        let env = SubnetEnv::parse(text).unwrap();
        assert_eq!((env.ipv4, env.mtu, env.ipmasq), (sample().ipv4, 1450, true));
    }

    #[test]
    fn previous_subnets_need_only_flannel_subnet_and_its_ipv6_twin() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("subnet.env");
        fs::write(&path, "FLANNEL_SUBNET=10.5.8.1/24\n").unwrap();
        assert_eq!(
            previous_subnets(&path).unwrap(),
            (Some("10.5.8.0/24".parse().unwrap()), None)
        );
        let dual = "FLANNEL_SUBNET=10.5.8.1/24\nFLANNEL_IPV6_SUBNET=fd10:0:0:8::1/64\n";
        fs::write(&path, dual).unwrap();
        assert_eq!(
            previous_subnets(&path).unwrap(),
            (
                Some("10.5.8.0/24".parse().unwrap()),
                Some("fd10:0:0:8::/64".parse().unwrap())
            )
        );
        fs::write(&path, "FLANNEL_SUBNET=10.5.8.1/24\nFLANNEL_IPV6_SUBNET=x\n").unwrap();
        let err = format!("{:#}", previous_subnets(&path).unwrap_err());
        assert!(err.contains("FLANNEL_IPV6_SUBNET"), "{err}");
        fs::write(&path, "FLANNEL_SUBNET=10.5.8.1/24\n").unwrap();
        assert!(SubnetEnv::read(&path)
            .unwrap_err()
            .to_string()
            .contains("reading"));
        fs::write(&path, "FLANNEL_SUBNET=bogus\n").unwrap();
        let err = format!("{:#}", previous_subnets(&path).unwrap_err());
        assert!(err.contains("FLANNEL_SUBNET \"bogus\""), "{err}");
    }

    #[test]
    fn anything_but_a_regular_file_is_refused_and_left_as_it_is() {
        use nix::sys::stat::{makedev, mknod, Mode, SFlag};
        let dir = tempfile::tempdir().unwrap();
        let device = dir.path().join("null");
        let mode = Mode::from_bits_truncate(0o666);
        mknod(&device, SFlag::S_IFCHR, mode, makedev(1, 3)).unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, mode).unwrap();
        for (path, what) in [
            (device.as_path(), "a character device"),
            (&fifo, "a FIFO"),
            (Path::new("/dev/zero"), "a character device"),
        ] {
            let want = format!("it is {what}, not a regular file");
            let err = format!("{:#}", previous_subnets(path).unwrap_err());
            assert!(err.contains(&want), "{err}");
            if path.starts_with(dir.path()) {
                let err = format!("{:#}", sample().write(path).unwrap_err());
                assert!(err.contains(&want), "{err}");
                assert!(!fs::metadata(path).unwrap().is_file(), "{path:?} replaced");
            }
        }
        let long = dir.path().join("long");
        fs::write(&long, "#".repeat(100_000)).unwrap();
        let err = format!("{:#}", previous_subnets(&long).unwrap_err());
        assert!(err.contains("longer than 65536 bytes"), "{err}");
    }

    #[test]
    fn missing_variable_is_named() {
        let err = SubnetEnv::parse(
            "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.8.1/24\nFLANNEL_IPMASQ=false\n",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(err, "FLANNEL_MTU is missing");
    }
}
