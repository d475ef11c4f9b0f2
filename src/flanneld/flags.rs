//! flanneld v0.28.9's flags (its main.go, and the three klog flags it copies), read from the
//! command line in Go's syntax and then from `FLANNELD_<FLAG>` variables for each flag the line
//! did not set, as flanneld's `flagutil.SetFlagsFromEnv` does.

use super::go_flag::{self, Kind, Parsed, Spec};

/// One of flanneld's flags, as `-h` lists it.
struct Flag {
    name: &'static str,
    kind: Kind,
    /// The default `-h` shows; empty for none.
    default: &'static str,
    usage: &'static str,
}

const fn flag(name: &'static str, kind: Kind, default: &'static str, usage: &'static str) -> Flag {
    Flag {
        name,
        kind,
        default,
        usage,
    }
}

use Kind::{Bool, Value};

/// Every flag flanneld v0.28.9 takes, in the order of its main.go.
const FLAGS: &[Flag] = &[
    flag(
        "etcd-endpoints",
        Value,
        "http://127.0.0.1:4001,http://127.0.0.1:2379",
        "comma-separated etcd endpoints",
    ),
    flag("etcd-prefix", Value, "/coreos.com/network", "etcd prefix"),
    flag("etcd-keyfile", Value, "", "TLS key file for etcd"),
    flag("etcd-certfile", Value, "", "TLS certificate file for etcd"),
    flag(
        "etcd-cafile",
        Value,
        "",
        "TLS certificate authority file for etcd",
    ),
    flag("etcd-username", Value, "", "etcd username (basic auth)"),
    flag("etcd-password", Value, "", "etcd password (basic auth)"),
    flag(
        "iface",
        Value,
        "",
        "interface (name or address) for traffic between hosts; repeat to try several in order",
    ),
    flag(
        "iface-regex",
        Value,
        "",
        "regular expression for the interface's name or address, tried after --iface; repeatable",
    ),
    flag(
        "iface-can-reach",
        Value,
        "",
        "the interface a route to this address leaves by (ip route get)",
    ),
    flag(
        "subnet-file",
        Value,
        "/run/flannel/subnet.env",
        "where the subnet, MTU, ... are written for container runtimes",
    ),
    flag(
        "public-ip",
        Value,
        "",
        "IPv4 address other nodes reach this one at",
    ),
    flag(
        "public-ipv6",
        Value,
        "",
        "IPv6 address other nodes reach this one at",
    ),
    flag(
        "subnet-lease-renew-margin",
        Value,
        "60",
        "renew the lease this many minutes before it expires (1 to 1439)",
    ),
    flag(
        "ip-masq",
        Bool,
        "false",
        "masquerade traffic from the network to outside it",
    ),
    flag(
        "ip-masq-fully-random-disable",
        Bool,
        "false",
        "masquerade without fully-random port mapping",
    ),
    flag(
        "kube-subnet-mgr",
        Bool,
        "false",
        "take the subnet from the Kubernetes API instead of etcd",
    ),
    flag(
        "kube-api-url",
        Value,
        "",
        "Kubernetes API server URL (not needed in a pod)",
    ),
    flag(
        "kube-annotation-prefix",
        Value,
        "flannel.alpha.coreos.com",
        "prefix of the Node annotations",
    ),
    flag(
        "kubeconfig-file",
        Value,
        "",
        "kubeconfig file (not needed in a pod)",
    ),
    flag("version", Bool, "false", "print the version and exit"),
    flag(
        "healthz-ip",
        Value,
        "0.0.0.0",
        "address of the health server",
    ),
    flag(
        "healthz-port",
        Value,
        "0",
        "port of the health server (/healthz, /readyz); 0: none",
    ),
    flag(
        "iptables-resync",
        Value,
        "5",
        "seconds between checks of the masquerade and forward rules",
    ),
    flag(
        "iptables-forward-rules",
        Bool,
        "true",
        "accept forwarding to and from the network",
    ),
    flag(
        "ip-blackhole-route",
        Bool,
        "false",
        "add a blackhole route for this node's subnet",
    ),
    flag(
        "net-config-path",
        Value,
        "/etc/kube-flannel/net-conf.json",
        "the network config file (Kubernetes)",
    ),
    flag(
        "set-node-network-unavailable",
        Bool,
        "true",
        "set the Node's NetworkUnavailable to False once ready",
    ),
    flag(
        "v",
        Value,
        "0",
        "log verbosity: 0 info, 1 to 4 debug, 5 and more trace",
    ),
    flag(
        "vmodule",
        Value,
        "",
        "klog's per-file verbosity (pattern=N,...): taken; use RUST_LOG for twill's modules",
    ),
    flag(
        "log_backtrace_at",
        Value,
        "",
        "klog's file:line backtrace: taken, without effect in twill",
    ),
];

/// The flags as Go's flag package sees them.
fn specs() -> Vec<Spec> {
    FLAGS
        .iter()
        .map(|f| Spec {
            name: f.name,
            kind: f.kind,
        })
        .collect()
}

/// Every flag's value after the command line and the environment: the line's, else its
/// `FLANNELD_` variable's, else flanneld's default.
#[derive(Debug)]
pub struct Values {
    /// Each flag given (on the line or through the environment) with its values in order.
    given: Vec<(&'static str, Vec<String>)>,
    /// Variables that set a flag, for the log.
    pub from_env: Vec<String>,
    /// Arguments after the flags, which flanneld ignores.
    pub ignored: Vec<String>,
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Request {
    Help,
    Run(Values),
}

impl Values {
    /// Reads `args` (without the program name), then `env` for each flag the line left unset.
    pub fn read(args: &[String], env: impl Fn(&str) -> Option<String>) -> Result<Request, String> {
        let (set, rest) = match go_flag::parse(&specs(), args)? {
            Parsed::Help => return Ok(Request::Help),
            Parsed::Flags { set, rest } => (set, rest),
        };
        let mut given: Vec<(&'static str, Vec<String>)> = Vec::new();
        for (name, value) in set {
            match given.iter_mut().find(|(n, _)| *n == name) {
                Some((_, values)) => values.push(value),
                None => given.push((name, vec![value])),
            }
        }
        let mut from_env = Vec::new();
        for flag in FLAGS {
            if given.iter().any(|(n, _)| *n == flag.name) {
                continue;
            }
            let variable = env_name(flag.name);
            let Some(value) = env(&variable).filter(|v| !v.is_empty()) else {
                continue;
            };
            let value = match flag.kind {
                Kind::Value => value,
                Kind::Bool => go_flag::parse_bool(&value)
                    .ok_or_else(|| format!("invalid value {value:?} for {variable}: parse error"))?
                    .to_string(),
            };
            from_env.push(variable);
            given.push((flag.name, vec![value]));
        }
        Ok(Request::Run(Values {
            given,
            from_env,
            ignored: rest,
        }))
    }

    /// A repeatable flag's values, in order.
    pub fn list(&self, name: &str) -> Vec<String> {
        self.given
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, values)| values.clone())
            .unwrap_or_default()
    }

    /// A flag's value: the last one given, else flanneld's default.
    pub fn text(&self, name: &str) -> &str {
        match self.given.iter().find(|(n, _)| *n == name) {
            Some((_, values)) => values.last().map_or("", String::as_str),
            None => default_of(name),
        }
    }

    /// A flag's value when set to something other than the empty text.
    pub fn optional(&self, name: &str) -> Option<String> {
        Some(self.text(name))
            .filter(|t| !t.is_empty())
            .map(str::to_string)
    }

    /// Whether the line or the environment gave the flag at all.
    pub fn given(&self, name: &str) -> bool {
        self.given.iter().any(|(n, _)| *n == name)
    }

    pub fn bool(&self, name: &str) -> bool {
        // Checked as they were read; the defaults are Go's spelling too.
        go_flag::parse_bool(self.text(name)) == Some(true)
    }

    /// An int flag, as Go's `flag.IntVar` reads it, within `range`.
    pub fn int(&self, name: &str, range: std::ops::RangeInclusive<i64>) -> Result<i64, String> {
        let text = self.text(name);
        let value = go_flag::parse_int(text)
            .ok_or_else(|| format!("invalid value {text:?} for flag -{name}: parse error"))?;
        if !range.contains(&value) {
            return Err(format!(
                "invalid value {value} for flag -{name}: must be from {} to {}",
                range.start(),
                range.end()
            ));
        }
        Ok(value)
    }
}

/// `FLANNELD_ETCD_ENDPOINTS` for `etcd-endpoints`.
fn env_name(flag: &str) -> String {
    format!("FLANNELD_{}", flag.to_uppercase().replace('-', "_"))
}

fn default_of(name: &str) -> &'static str {
    FLAGS
        .iter()
        .find(|f| f.name == name)
        .map_or("", |f| f.default)
}

/// `-h`'s text, in the layout of Go's `PrintDefaults`.
pub fn usage(program: &str) -> String {
    let mut text = format!("Usage: {program} [OPTION]...\n");
    for flag in FLAGS {
        let kind = match flag.kind {
            Kind::Bool => "",
            Kind::Value => " value",
        };
        text.push_str(&format!("  -{}{kind}\n    \t{}", flag.name, flag.usage));
        if !flag.default.is_empty() && flag.default != "false" && flag.default != "0" {
            text.push_str(&format!(" (default {:?})", flag.default));
        }
        text.push('\n');
    }
    text.push_str(
        "\nEvery flag can also be set by FLANNELD_<FLAG> (e.g. FLANNELD_IFACE); a flag on the \
         command line wins.\ntwill's own command line: `twill run --help`, `twill status`.\n",
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    fn read(line: &str, vars: &'static [(&'static str, &'static str)]) -> Result<Values, String> {
        let args: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        match Values::read(&args, env(vars))? {
            Request::Run(values) => Ok(values),
            Request::Help => Err("help".into()),
        }
    }

    #[test]
    fn the_line_wins_over_the_environment_and_defaults_fill_the_rest() {
        let v = read(
            "-iface=eth1 --ip-masq -iface 10.0.0.2",
            &[
                ("FLANNELD_IFACE", "eth9"),
                ("FLANNELD_ETCD_PREFIX", "/other"),
                ("FLANNELD_KUBE_SUBNET_MGR", "true"),
                ("FLANNELD_HEALTHZ_PORT", ""),
            ],
        )
        .unwrap();
        assert_eq!(v.list("iface"), ["eth1", "10.0.0.2"]);
        assert_eq!(v.text("etcd-prefix"), "/other");
        assert!(v.bool("ip-masq") && v.bool("kube-subnet-mgr"));
        assert!(v.bool("iptables-forward-rules"), "default true");
        assert_eq!(v.int("healthz-port", 0..=65535), Ok(0));
        assert_eq!(
            v.text("etcd-endpoints"),
            "http://127.0.0.1:4001,http://127.0.0.1:2379"
        );
        assert_eq!(
            v.from_env,
            ["FLANNELD_ETCD_PREFIX", "FLANNELD_KUBE_SUBNET_MGR"]
        );
        assert!(!v.given("public-ip") && v.given("iface"));
    }

    #[test]
    fn a_bad_value_is_refused_naming_its_flag_or_variable() {
        let err = read("", &[("FLANNELD_IP_MASQ", "yes")]).unwrap_err();
        assert_eq!(
            err,
            "invalid value \"yes\" for FLANNELD_IP_MASQ: parse error"
        );
        let v = read("-healthz-port=80a", &[]).unwrap();
        let err = v.int("healthz-port", 0..=65535).unwrap_err();
        assert_eq!(
            err,
            "invalid value \"80a\" for flag -healthz-port: parse error"
        );
        let v = read("-subnet-lease-renew-margin 1440", &[]).unwrap();
        let err = v.int("subnet-lease-renew-margin", 1..=1439).unwrap_err();
        assert!(err.contains("-subnet-lease-renew-margin") && err.contains("1 to 1439"));
        assert_eq!(
            read("-dataplane ebpf", &[]).unwrap_err(),
            "flag provided but not defined: -dataplane"
        );
    }

    #[test]
    fn every_flag_has_its_variable_and_help_lists_them_all() {
        assert_eq!(env_name("etcd-endpoints"), "FLANNELD_ETCD_ENDPOINTS");
        assert_eq!(env_name("log_backtrace_at"), "FLANNELD_LOG_BACKTRACE_AT");
        let text = usage("flanneld");
        for flag in FLAGS {
            assert!(text.contains(&format!("  -{}", flag.name)), "{}", flag.name);
        }
        assert_eq!(FLAGS.len(), 31, "flanneld v0.28.9's 28 flags and klog's 3");
    }
}
