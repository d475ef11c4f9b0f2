//! flanneld v0.28.9's command line, so that twill replaces flanneld where it runs without a
//! change to the unit or the manifest: started as `flanneld` (a link to twill, or twill copied
//! there) or with no subcommand, twill takes exactly flanneld's flags in Go's syntax and its
//! `FLANNELD_*` variables, and refuses in one line any flag flanneld does not have.
//!
//! flanneld's defaults are twill's here: etcd at `http://127.0.0.1:4001,http://127.0.0.1:2379`
//! unless `-kube-subnet-mgr`; twill's own settings keep their defaults (the dataplane: tun),
//! which `TWILL_DATAPLANE` and `TWILL_BPF_DIR` change here and `twill run` changes by flag.

mod flags;
mod go_flag;

use crate::twill_cli::parse_public_ipv6;
use flags::{Request, Values};
use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;
use twill_control::daemon::NodeOptions;
use twill_control::host::InterfaceChoice;
use twill_control::launch::{Launch, Leases};
use twill_control::registry::kube::{KubeEnv, KubeOptions, KubeTiming};
use twill_control::registry::EtcdOptions;
use twill_control::status;
use twill_control::traffic::TrafficOptions;

/// Go's flag package exits with 2 on a bad command line.
const BAD_COMMAND_LINE: i32 = 2;

/// The flags that only etcd mode reads, and those only Kubernetes mode reads: given in the other
/// mode they do nothing, which flanneld does not say and twill does.
const ETCD_ONLY: [&str; 8] = [
    "etcd-endpoints",
    "etcd-prefix",
    "etcd-keyfile",
    "etcd-certfile",
    "etcd-cafile",
    "etcd-username",
    "etcd-password",
    "subnet-lease-renew-margin",
];
const KUBE_ONLY: [&str; 5] = [
    "kube-api-url",
    "kube-annotation-prefix",
    "kubeconfig-file",
    "net-config-path",
    "set-node-network-unavailable",
];

/// `args` with the program's name first; the exit code.
pub fn main(args: &[OsString]) -> i32 {
    let program = args.first().map_or("flanneld".into(), |p| {
        Path::new(p).file_name().unwrap_or(p).to_string_lossy()
    });
    let parsed = utf8(&args[1.min(args.len())..])
        .and_then(|args| Values::read(&args, |name| std::env::var(name).ok()));
    let values = match parsed {
        Ok(Request::Run(values)) => values,
        Ok(Request::Help) => {
            eprint!("{}", flags::usage(&program));
            return 0;
        }
        Err(e) => {
            eprintln!(
                "{program}: {e} (flanneld's command line; twill's own is `twill run --help`)"
            );
            return BAD_COMMAND_LINE;
        }
    };
    if values.bool("version") {
        println!("twill {}", crate::VERSION);
        return 0;
    }
    let verbosity = match log_flags(&values) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("{program}: {e}");
            return BAD_COMMAND_LINE;
        }
    };
    crate::logging::init(&crate::logging::filter_for(verbosity));
    say_what_was_read(&values);
    match launch(&values, &|name| std::env::var(name).ok()) {
        Ok(launch) => crate::run(launch),
        Err(e) => crate::exit_code(Err(e)),
    }
}

fn utf8(args: &[OsString]) -> Result<Vec<String>, String> {
    args.iter()
        .map(|a| {
            a.to_str()
                .map(str::to_string)
                .ok_or_else(|| format!("argument {a:?} is not UTF-8"))
        })
        .collect()
}

/// klog's flags: `-v` (the verbosity, returned), and `-vmodule` and `-log_backtrace_at`,
/// checked as klog checks them.
fn log_flags(values: &Values) -> Result<i64, String> {
    let v = values.text("v");
    let verbosity = v
        .parse::<i32>()
        .map_err(|_| format!("invalid value {v:?} for flag -v: parse error"))?;
    let vmodule = values.text("vmodule");
    let well_formed = |spec: &str| {
        spec.split_once('=')
            .is_some_and(|(pattern, level)| !pattern.is_empty() && level.parse::<i32>().is_ok())
    };
    if !vmodule.is_empty() && !vmodule.split(',').all(well_formed) {
        return Err(format!(
            "invalid value {vmodule:?} for flag -vmodule: syntax error: expect comma-separated \
             list of filename=N"
        ));
    }
    let at = values.text("log_backtrace_at");
    let location_ok = at
        .rsplit_once(':')
        .is_some_and(|(file, line)| !file.is_empty() && line.parse::<u32>().is_ok());
    if !at.is_empty() && !location_ok {
        return Err(format!(
            "invalid value {at:?} for flag -log_backtrace_at: syntax error: expect file.go:234"
        ));
    }
    Ok(i64::from(verbosity))
}

/// Logs what of the command line twill reads differently from flanneld, once, at start.
fn say_what_was_read(values: &Values) {
    tracing::info!("flanneld's command line (twill {})", crate::VERSION);
    if !values.from_env.is_empty() {
        tracing::info!("flags from the environment: {}", values.from_env.join(", "));
    }
    if !values.ignored.is_empty() {
        tracing::warn!(
            "arguments after the flags are ignored, as flanneld ignores them: {:?}",
            values.ignored
        );
    }
    if values.given("vmodule") || values.given("log_backtrace_at") {
        tracing::warn!(
            "-vmodule and -log_backtrace_at are klog's and name flanneld's Go files: taken, \
             without effect; twill's log follows -v, or RUST_LOG (e.g. twill_control=debug)"
        );
    }
    let (mode, unused): (&str, &[&str]) = match values.bool("kube-subnet-mgr") {
        true => ("-kube-subnet-mgr", &ETCD_ONLY),
        false => ("etcd (no -kube-subnet-mgr)", &KUBE_ONLY),
    };
    for flag in unused.iter().filter(|f| values.given(f)) {
        tracing::warn!("-{flag} has no effect with {mode}, as in flanneld");
    }
}

/// The environment a face reads besides its flags (`NODE_NAME`, `POD_NAME`, ...).
type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The node flanneld's flags describe.
fn launch(values: &Values, env: Env) -> anyhow::Result<Launch> {
    let leases = match values.bool("kube-subnet-mgr") {
        true => Leases::Kube(kube_options(values, env)?),
        false => Leases::Etcd(etcd_options(values)?),
    };
    Ok(Launch {
        leases,
        node: twill_settings(node_options(values)?, env)?,
    })
}

/// twill's own settings that flanneld has no flag for, from `TWILL_*` variables as `twill run`
/// also reads them: `TWILL_DATAPLANE` (auto, the default, tun or ebpf) and `TWILL_BPF_DIR`.
/// A manifest sets them in the container's env; the command line stays flanneld's.
fn twill_settings(node: NodeOptions, env: Env) -> anyhow::Result<NodeOptions> {
    let dataplane = match env("TWILL_DATAPLANE") {
        Some(text) => text
            .parse()
            .map_err(|e| anyhow::anyhow!("TWILL_DATAPLANE: {e}"))?,
        None => node.dataplane,
    };
    let bpf_dir = env("TWILL_BPF_DIR").map_or(node.bpf_dir, Into::into);
    Ok(NodeOptions {
        dataplane,
        bpf_dir,
        ..node
    })
}

fn kube_options(values: &Values, env: Env) -> anyhow::Result<KubeOptions> {
    let env = KubeEnv::read(env)?;
    Ok(KubeOptions {
        api_url: values.optional("kube-api-url"),
        kubeconfig: values.optional("kubeconfig-file").map(Into::into),
        annotation_prefix: values.text("kube-annotation-prefix").to_string(),
        net_config_path: values.text("net-config-path").into(),
        node: env.node,
        event_queue: env.event_queue,
        set_network_available: values.bool("set-node-network-unavailable"),
        timing: KubeTiming::default(),
    })
}

fn etcd_options(values: &Values) -> anyhow::Result<EtcdOptions> {
    let mut options = EtcdOptions::new(values.text("etcd-endpoints"));
    anyhow::ensure!(
        !options.endpoints.is_empty(),
        "-etcd-endpoints names no endpoint"
    );
    options.prefix = values.text("etcd-prefix").to_string();
    options.cafile = values.optional("etcd-cafile").map(Into::into);
    options.certfile = values.optional("etcd-certfile").map(Into::into);
    options.keyfile = values.optional("etcd-keyfile").map(Into::into);
    options.username = values.optional("etcd-username");
    options.password = values.optional("etcd-password");
    let margin = values
        .int("subnet-lease-renew-margin", 1..=1439)
        .map_err(anyhow::Error::msg)?;
    options.timing.renew_margin = Duration::from_secs(60 * margin.unsigned_abs());
    Ok(options)
}

fn node_options(values: &Values) -> anyhow::Result<NodeOptions> {
    let int = |name, range| values.int(name, range).map_err(anyhow::Error::msg);
    let ifaces = values.list("iface");
    anyhow::ensure!(
        ifaces.iter().all(|i| !i.is_empty()),
        "-iface is empty: give an interface's name or one of its addresses"
    );
    let healthz = SocketAddr::new(
        parsed(values, "healthz-ip", "an IP address")?.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        u16::try_from(int("healthz-port", 0..=65535)?)?,
    );
    let public_ipv6 = values.optional("public-ipv6");
    Ok(NodeOptions {
        interface: InterfaceChoice {
            ifaces,
            regexes: values.list("iface-regex"),
            can_reach: parsed(values, "iface-can-reach", "an IP address")?,
        },
        public_ip: parsed(values, "public-ip", "an IPv4 address")?,
        public_ipv6: public_ipv6
            .map(|ip| parse_public_ipv6(&ip))
            .transpose()
            .map_err(|e| anyhow::anyhow!("invalid value for flag -public-ipv6: {e}"))?,
        subnet_file: values.text("subnet-file").into(),
        traffic: TrafficOptions {
            ip_masq: values.bool("ip-masq"),
            forward_rules: values.bool("iptables-forward-rules"),
            fully_random: !values.bool("ip-masq-fully-random-disable"),
            resync: Duration::from_secs(int("iptables-resync", 1..=3600)?.unsigned_abs()),
        },
        status_addrs: status::addresses(status::DEFAULT_ADDR.parse()?, healthz),
        blackhole_route: values.bool("ip-blackhole-route"),
        ..NodeOptions::default()
    })
}

/// A flag holding `what` (an address), `None` when unset or empty.
fn parsed<T: std::str::FromStr>(
    values: &Values,
    name: &str,
    what: &str,
) -> anyhow::Result<Option<T>> {
    let Some(text) = values.optional(name) else {
        return Ok(None);
    };
    text.parse()
        .map(Some)
        .map_err(|_| anyhow::anyhow!("invalid value {text:?} for flag -{name}: not {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use twill_control::node::DataplaneChoice;

    fn values(line: &str) -> Values {
        let args: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        match Values::read(&args, |_| None).unwrap() {
            Request::Run(values) => values,
            Request::Help => panic!("help"),
        }
    }

    #[test]
    fn kube_flannel_yml_s_arguments_are_a_kubernetes_node_with_its_probes() {
        let pod = |name: &str| match name {
            "POD_NAME" => Some("kube-flannel-ds-x".to_string()),
            "POD_NAMESPACE" => Some("kube-flannel".to_string()),
            _ => None,
        };
        let args = values("--ip-masq --kube-subnet-mgr --healthz-port=8081");
        let launch = launch(&args, &pod).unwrap();
        let Leases::Kube(kube) = launch.leases else {
            panic!("not Kubernetes");
        };
        assert_eq!(
            kube.node,
            twill_control::registry::kube::NodeIdentity::Pod {
                namespace: "kube-flannel".into(),
                name: "kube-flannel-ds-x".into()
            }
        );
        assert!(kube.set_network_available);
        assert!(launch.node.traffic.ip_masq && launch.node.traffic.forward_rules);
        let probes: SocketAddr = "0.0.0.0:8081".parse().unwrap();
        assert!(launch
            .node
            .status_addrs
            .contains(&status::StatusAddr::Healthz(probes)));
    }

    #[test]
    fn twill_s_dataplane_is_the_tun_unless_its_variables_say_otherwise() {
        let default = launch(&values(""), &|_| None).unwrap().node;
        assert_eq!(default.dataplane, DataplaneChoice::Auto);
        let env = |name: &str| match name {
            "TWILL_DATAPLANE" => Some("ebpf".to_string()),
            "TWILL_BPF_DIR" => Some("/run/twill-bpf".to_string()),
            _ => None,
        };
        let set = launch(&values(""), &env).unwrap().node;
        assert_eq!(set.dataplane, DataplaneChoice::Ebpf);
        assert_eq!(set.bpf_dir, std::path::Path::new("/run/twill-bpf"));
        let wrong = |name: &str| (name == "TWILL_DATAPLANE").then(|| "xdp".to_string());
        let err = launch(&values(""), &wrong).err().unwrap().to_string();
        assert_eq!(
            err,
            r#"TWILL_DATAPLANE: "xdp" is not a dataplane; give tun, ebpf or auto"#
        );
    }

    #[test]
    fn etcd_mode_takes_flanneld_s_defaults_and_flags() {
        let args = values(
            "-iface=eth1 -iface 10.0.0.2 -iface-regex ^en -iface-can-reach 192.0.2.1 \
             -etcd-prefix /other -subnet-lease-renew-margin 30 -public-ip 10.0.0.2",
        );
        let launch = launch(&args, &|_| None).unwrap();
        let Leases::Etcd(etcd) = launch.leases else {
            panic!("not etcd");
        };
        assert_eq!(
            etcd.endpoints,
            ["http://127.0.0.1:4001", "http://127.0.0.1:2379"]
        );
        assert_eq!(etcd.prefix, "/other");
        assert_eq!(etcd.timing.renew_margin, Duration::from_secs(30 * 60));
        let choice = launch.node.interface;
        assert_eq!(choice.ifaces, ["eth1", "10.0.0.2"]);
        assert_eq!(choice.regexes, ["^en"]);
        assert_eq!(choice.can_reach, Some("192.0.2.1".parse().unwrap()));
        assert_eq!(launch.node.public_ip, Some("10.0.0.2".parse().unwrap()));
        assert_eq!(
            launch.node.status_addrs.len(),
            1,
            "no health port by default"
        );
    }

    #[test]
    fn bad_values_are_refused_naming_the_flag() {
        for (line, named) in [
            ("-public-ip 10.0.0", "-public-ip"),
            ("-public-ipv6 fe80::1", "-public-ipv6"),
            ("-healthz-port 70000", "-healthz-port"),
            ("-iptables-resync 0", "-iptables-resync"),
            ("-subnet-lease-renew-margin 0", "-subnet-lease-renew-margin"),
            ("-iface-can-reach eth0", "-iface-can-reach"),
            ("-iface=", "-iface"),
            ("-etcd-endpoints=,", "-etcd-endpoints"),
        ] {
            let err = launch(&values(line), &|_| None).err().unwrap();
            let err = format!("{err:#}");
            assert!(err.contains(named) && !err.contains('\n'), "{line}: {err}");
        }
        for line in [
            "-v x",
            "-vmodule kube",
            "-vmodule =2",
            "-log_backtrace_at main.go",
        ] {
            assert!(log_flags(&values(line)).is_err(), "{line}");
        }
        assert_eq!(
            log_flags(&values(
                "-v=4 -vmodule kube=4,main=2 -log_backtrace_at main.go:12"
            )),
            Ok(4)
        );
    }
}
