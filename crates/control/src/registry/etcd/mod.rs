//! Leases in etcd (v3 API), in flannel's schema, so twill and flanneld nodes share a network.

mod acquire;
mod keeper;
mod members;
mod store;
mod taken;
mod tls_probe;

use super::{Backoff, Registry, EVENT_QUEUE};
use crate::config::Config;
use crate::lease::{subnets_prefix, Lease, LeaseAttrs, Subnets};
use crate::lease::{LeaseEvent, LeaseNamer};
use crate::small_file;
use anyhow::{anyhow, bail, Context};
use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use ipnet::{Ipv4Net, Ipv6Net};
use keeper::Keeper;
use std::path::{Path, PathBuf};
use std::time::Duration;
use store::{describe, is_unreachable, with_deadline, Store};
use tokio::sync::mpsc;
use tracing::warn;

/// flanneld's `--etcd-prefix` default.
pub const DEFAULT_PREFIX: &str = "/coreos.com/network";
/// flanneld's `--etcd-endpoints` default.
pub const DEFAULT_ENDPOINTS: &str = "http://127.0.0.1:4001,http://127.0.0.1:2379";

/// How to reach etcd and where the network lives in it (flanneld's `--etcd-*` flags).
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    pub endpoints: Vec<String>,
    pub prefix: String,
    /// CA bundle to verify etcd's certificate; TLS is used when any of the three files is set.
    pub cafile: Option<PathBuf>,
    /// Client certificate and key, for etcd with client-certificate auth.
    pub certfile: Option<PathBuf>,
    pub keyfile: Option<PathBuf>,
    pub username: Option<String>,
    pub password: Option<String>,
    /// The subnet a previous run held (FLANNEL_SUBNET of `--subnet-file`); preferred when free,
    /// so a node keeps its subnet across restarts even if its lease expired meanwhile.
    pub previous_subnet: Option<Ipv4Net>,
    /// The IPv6 subnet a previous run held (FLANNEL_IPV6_SUBNET). On a dual-stack network the
    /// previous subnets are preferred only as a pair, as flanneld prefers them.
    pub previous_ipv6_subnet: Option<Ipv6Net>,
    pub timing: Timing,
}

/// Every interval the registry uses. The defaults are flanneld's; tests shorten them.
#[derive(Debug, Clone)]
pub struct Timing {
    /// TTL of the etcd lease that carries our key (flannel: 24 h). If twill dies, the key goes
    /// away after this long and its subnet becomes free.
    pub lease_ttl: Duration,
    /// Renew this long before expiry (`--subnet-lease-renew-margin`, flannel: 60 min).
    pub renew_margin: Duration,
    /// Wait after a failed renewal or re-acquisition (flannel: 1 min).
    pub retry_interval: Duration,
    /// First and longest wait between attempts to reach etcd or to re-establish the watch.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Deadline for one etcd request; also paces the HTTP/2 keep-alive that detects a dead
    /// connection under an idle watch.
    pub request_timeout: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            lease_ttl: Duration::from_secs(24 * 3600),
            renew_margin: Duration::from_secs(60 * 60),
            retry_interval: Duration::from_secs(60),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
        }
    }
}

impl Timing {
    fn backoff(&self) -> Backoff {
        Backoff::new(self.backoff_min, self.backoff_max)
    }

    fn renew_after(&self) -> Duration {
        self.lease_ttl - self.renew_margin
    }

    fn check(&self) -> anyhow::Result<()> {
        if self.renew_margin >= self.lease_ttl {
            bail!(
                "--subnet-lease-renew-margin ({:?}) must be shorter than the lease TTL ({:?})",
                self.renew_margin,
                self.lease_ttl
            );
        }
        Ok(())
    }
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions::new(DEFAULT_ENDPOINTS)
    }
}

impl EtcdOptions {
    /// Options for a comma-separated endpoint list (`--etcd-endpoints`), with flanneld's other
    /// defaults.
    pub fn new(endpoints: &str) -> Self {
        EtcdOptions {
            endpoints: endpoints
                .split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(str::to_string)
                .collect(),
            prefix: DEFAULT_PREFIX.to_string(),
            cafile: None,
            certfile: None,
            keyfile: None,
            username: None,
            password: None,
            previous_subnet: None,
            previous_ipv6_subnet: None,
            timing: Timing::default(),
        }
    }
}

/// A connection to etcd with the network config already read and validated.
pub struct EtcdRegistry {
    store: Store,
    config: Config,
    opts: EtcdOptions,
}

impl EtcdRegistry {
    /// Connects and reads `<prefix>/config`. While etcd cannot be reached this retries with
    /// backoff and logs each attempt, because a node often boots before etcd does. While the
    /// config is not there yet it checks again every second, as flanneld does (hosts whose
    /// units start before the operator writes the config come up by themselves), said once.
    /// An invalid config, bad credentials or unreadable TLS files fail at once with a
    /// one-line error: waiting would not fix them.
    pub async fn connect(opts: EtcdOptions) -> anyhow::Result<EtcdRegistry> {
        opts.timing.check()?;
        let mut backoff = opts.timing.backoff();
        let mut said_missing = false;
        loop {
            match Self::try_connect(&opts).await {
                Err(e) if e.is::<ConfigMissing>() => {
                    if !said_missing {
                        warn!("{e}; checking again every second until it does");
                        said_missing = true;
                    }
                    tokio::time::sleep(CONFIG_RECHECK).await;
                }
                Err(e) if is_unreachable(&e) => {
                    let timeout = opts.timing.request_timeout;
                    if let Some(why) = tls_probe::tls_failure(&opts, timeout).await {
                        bail!(
                            "TLS handshake with etcd failed ({why}); check --etcd-cafile, \
                             --etcd-certfile and --etcd-keyfile"
                        );
                    }
                    let delay = backoff.next_delay();
                    warn!(
                        "etcd at {} is unreachable ({}); retrying in {delay:?}",
                        opts.endpoints.join(","),
                        describe(&e)
                    );
                    tokio::time::sleep(delay).await;
                }
                result => return result,
            }
        }
    }

    async fn try_connect(opts: &EtcdOptions) -> anyhow::Result<EtcdRegistry> {
        let timeout = opts.timing.request_timeout;
        let tls = uses_tls(opts);
        let all: Vec<String> = opts
            .endpoints
            .iter()
            .map(|e| members::url(e, tls))
            .collect();
        let (pool, _) = members::pool(&all).await;
        let connect = Client::connect(&pool, Some(connect_options(opts)?));
        let client = with_deadline("connect", timeout, connect).await?;
        let members = members::keep(client.clone(), all, pool);
        let store = Store::new(client, members, &opts.prefix, timeout);
        let config = read_config(&store).await?;
        Ok(EtcdRegistry {
            store,
            config,
            opts: opts.clone(),
        })
    }
}

/// How often a node without its network config looks again: flanneld's second.
const CONFIG_RECHECK: Duration = Duration::from_secs(1);

/// The network config's key does not exist (yet).
#[derive(Debug, thiserror::Error)]
#[error("flannel network config not found: etcd key {key} does not exist (create it with etcdctl put {key} '{{\"Network\":\"10.5.0.0/16\"}}')")]
struct ConfigMissing {
    key: String,
}

async fn read_config(store: &Store) -> anyhow::Result<Config> {
    let key = store.config_key();
    let Some(json) = store.config_json().await? else {
        return Err(ConfigMissing { key }.into());
    };
    Config::parse(&json).map_err(|e| anyhow!("{e} (etcd key {key})"))
}

fn connect_options(opts: &EtcdOptions) -> anyhow::Result<ConnectOptions> {
    let t = opts.timing.request_timeout;
    let mut options = ConnectOptions::new()
        .with_connect_timeout(t)
        .with_keep_alive(t * 2, t)
        .with_require_leader(true);
    if let Some(user) = &opts.username {
        // etcd's auth tokens expire (5 min by default) and vanish on restart; a daemon that
        // renews once a day must log in again when its token is refused.
        options = options
            .with_user(user, opts.password.clone().unwrap_or_default())
            .with_auto_token_refresh(true);
    }
    if let Some(tls) = tls_options(opts)? {
        options = options.with_tls(tls);
    }
    Ok(options)
}

/// TLS is used when any of the three files is set.
fn uses_tls(opts: &EtcdOptions) -> bool {
    opts.cafile.is_some() || opts.certfile.is_some() || opts.keyfile.is_some()
}

fn tls_options(opts: &EtcdOptions) -> anyhow::Result<Option<TlsOptions>> {
    if !uses_tls(opts) {
        return Ok(None);
    }
    let mut tls = TlsOptions::new();
    if let Some(ca) = &opts.cafile {
        tls = tls.ca_certificate(Certificate::from_pem(read_pem(ca, "--etcd-cafile")?));
    }
    match (&opts.certfile, &opts.keyfile) {
        (Some(cert), Some(key)) => {
            let identity = Identity::from_pem(
                read_pem(cert, "--etcd-certfile")?,
                read_pem(key, "--etcd-keyfile")?,
            );
            tls = tls.identity(identity);
        }
        (None, None) => {}
        _ => bail!("--etcd-certfile and --etcd-keyfile must be given together"),
    }
    Ok(Some(tls))
}

impl EtcdRegistry {
    /// Acquires, retrying while etcd is unreachable: it may have gone away since `connect`.
    async fn acquire(&self, attrs: &LeaseAttrs) -> anyhow::Result<Lease> {
        let timing = &self.opts.timing;
        let mut backoff = timing.backoff();
        let previous =
            Subnets::from_parts(self.opts.previous_subnet, self.opts.previous_ipv6_subnet);
        loop {
            match acquire::acquire(&self.store, &self.config, attrs, previous, timing.lease_ttl)
                .await
            {
                Err(e) if is_unreachable(&e) => {
                    let delay = backoff.next_delay();
                    warn!(
                        "acquiring a lease failed ({}); retrying in {delay:?}",
                        describe(&e)
                    );
                    tokio::time::sleep(delay).await;
                }
                result => return result,
            }
        }
    }
}

/// Reads a TLS file and checks that it holds what the flag says, so a wrong file is named at
/// start instead of failing every handshake later as "etcd unreachable".
fn read_pem(path: &Path, flag: &str) -> anyhow::Result<Vec<u8>> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let pem = small_file::read(path, small_file::CONFIG)
        .with_context(|| format!("{flag} {}", path.display()))?;
    let holds = if flag == "--etcd-keyfile" {
        PrivateKeyDer::from_pem_slice(&pem)
            .map(drop)
            .map_err(|e| format!("no PEM private key in it ({e})"))
    } else {
        match CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>() {
            Ok(certs) if !certs.is_empty() => Ok(()),
            Ok(_) => Err("no PEM certificate in it".to_string()),
            Err(e) => Err(format!("not a PEM certificate file ({e})")),
        }
    };
    holds.map_err(|why| anyhow!("{flag} {}: {why}", path.display()))?;
    Ok(pem)
}

impl Registry for EtcdRegistry {
    fn config(&self) -> &Config {
        &self.config
    }

    fn name(&self) -> String {
        format!(
            "etcd {} (prefix {})",
            self.opts.endpoints.join(","),
            self.opts.prefix
        )
    }

    fn lease_namer(&self) -> LeaseNamer {
        LeaseNamer::EtcdKey(subnets_prefix(&self.opts.prefix))
    }

    /// Acquires our lease in flannel's order (the lease of our public IP, else the previous
    /// subnets if free, else random free ones; a lost create race is retried), then spawns the
    /// task that renews it, re-acquires it if its key disappears, and watches the other leases.
    async fn start(self, attrs: LeaseAttrs) -> anyhow::Result<(Lease, mpsc::Receiver<LeaseEvent>)> {
        let timing = self.opts.timing.clone();
        let lease = self.acquire(&attrs).await?;
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let keeper = Keeper::new(self.store, self.config, timing, lease.clone(), tx);
        tokio::spawn(keeper.run());
        Ok((lease, rx))
    }
}
