//! Reaching the API server as flanneld does: a kubeconfig file, an API URL, or the pod's
//! service account; and errors in words an operator can act on.

use super::watch_pace::WatchPaceLayer;
use super::{KubeOptions, KubeTiming};
use crate::small_file;
use anyhow::{anyhow, Context};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use std::path::Path;
use tower::{BoxError, ServiceBuilder};

/// The client for `--kubeconfig-file` (its server replaced by `--kube-api-url` if given),
/// else for `--kube-api-url` with the pod's service account if there is one, else for the
/// pod's service account at `KUBERNETES_SERVICE_HOST` (in-cluster, as a DaemonSet runs).
pub async fn connect(opts: &KubeOptions) -> anyhow::Result<Client> {
    let mut config = match (&opts.kubeconfig, &opts.api_url) {
        (Some(path), _) => {
            let flag = || format!("--kubeconfig-file {}", path.display());
            small_file::check_path(path, small_file::CONFIG).with_context(flag)?;
            let file = Kubeconfig::read_from(path).with_context(flag)?;
            files_named_in(&file).with_context(flag)?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("--kubeconfig-file {}", path.display()))?
        }
        (None, Some(url)) => match Config::incluster() {
            Ok(config) => config,
            Err(_) => Config::new(parse_url(url)?),
        },
        (None, None) => Config::incluster().map_err(|e| {
            anyhow!(
                "not running in a pod ({e}), and neither --kubeconfig-file nor --kube-api-url \
                 was given: twill cannot find the Kubernetes API server"
            )
        })?,
    };
    if let Some(url) = &opts.api_url {
        config.cluster_url = parse_url(url)?;
    }
    with_keepalive(config, &opts.timing).context("cannot build a Kubernetes client")
}

/// kube's own client, on connections that notice a dead peer within about `timeout`: TCP
/// keepalive probes after `timeout / 2` without traffic, and TCP_USER_TIMEOUT, which ends a
/// connection whose probes or data go unanswered for `timeout`. kube's default connections
/// have neither, so a watch whose connection died silently (a path that dropped its packets
/// while the API server restarted) waited for its idle timeout, about five minutes, before it
/// watched again. client-go gets the same from HTTP/2 pings; kube speaks HTTP/1.1 here. Its
/// watches are paced ([`WatchPaceLayer`]) where they end at once.
fn with_keepalive(config: Config, timing: &KubeTiming) -> Result<Client, kube::Error> {
    let timeout = timing.request_timeout;
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_connect_timeout(Some(timeout));
    tcp.set_keepalive(Some(timeout / 2));
    tcp.set_keepalive_interval(Some(timeout / 5));
    tcp.set_keepalive_retries(Some(3));
    tcp.set_tcp_user_timeout(Some(timeout));
    let https = config.rustls_https_connector_with_connector(tcp)?;
    let http = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .layer(WatchPaceLayer::new(timing.backoff()))
        .service(http);
    Ok(Client::new(service, config.default_namespace))
}

/// The files a kubeconfig names (a CA, a client certificate and key, a token file), which
/// kube reads whole: each must be a regular file of a sane size too.
fn files_named_in(kubeconfig: &Kubeconfig) -> anyhow::Result<()> {
    let clusters = kubeconfig
        .clusters
        .iter()
        .filter_map(|c| c.cluster.as_ref());
    let cas = clusters.filter_map(|c| c.certificate_authority.as_deref());
    let users = kubeconfig
        .auth_infos
        .iter()
        .filter_map(|a| a.auth_info.as_ref());
    let user_files = users.flat_map(|u| {
        [&u.client_certificate, &u.client_key, &u.token_file]
            .into_iter()
            .filter_map(|f| f.as_deref())
    });
    for named in cas.chain(user_files) {
        small_file::check_path(Path::new(named), small_file::CONFIG)
            .with_context(|| format!("the file {named} it names"))?;
    }
    Ok(())
}

fn parse_url(url: &str) -> anyhow::Result<http::Uri> {
    url.parse()
        .with_context(|| format!("--kube-api-url {url:?} is not a URL"))
}

/// What went wrong with one request, and whether waiting could fix it.
#[derive(Debug)]
pub enum Failure {
    /// The server could not be reached, or answered that it is not ready: retry.
    Unreachable(String),
    /// The credentials were refused (401) or lack a permission (403): retrying will not help.
    Denied(String),
    /// Anything else the server refused.
    Refused(String),
}

impl Failure {
    /// The words, whatever the kind.
    pub fn text(self) -> String {
        match self {
            Failure::Unreachable(why) | Failure::Denied(why) | Failure::Refused(why) => why,
        }
    }

    /// Classifies `error` from `verb` on `resource` (e.g. "patch", "nodes/status").
    pub fn of(error: &kube::Error, verb: &str, resource: &str) -> Failure {
        match error {
            kube::Error::Api(status) if status.code == 401 => Failure::Denied(format!(
                "the API server does not accept twill's credentials (401 Unauthorized) to {verb} \
                 {resource}: check the service account token or --kubeconfig-file"
            )),
            kube::Error::Api(status) if status.code == 403 => Failure::Denied(format!(
                "twill's service account may not {verb} {resource} (403 Forbidden: {}); grant it \
                 in twill's ClusterRole (deploy/kubernetes/twill.yml has the rules twill needs)",
                status.message
            )),
            kube::Error::Api(status) if matches!(status.code, 429 | 500..=599) => {
                Failure::Unreachable(format!(
                    "{verb} {resource}: {} {}",
                    status.code, status.message
                ))
            }
            kube::Error::Api(status) => Failure::Refused(format!(
                "{verb} {resource}: {} {}",
                status.code, status.message
            )),
            other => Failure::Unreachable(format!("{verb} {resource}: {}", chain(other))),
        }
    }
}

/// An error with its causes, on one line: "connection refused" sits at the bottom of the chain.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
}
