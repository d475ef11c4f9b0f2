use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::path::Path;
use twill_lab::{Etcd, KubeApiServer, Lab, LabSpec, Netns};

const PROBE_ACCOUNT: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: twill-probe
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: probe
  namespace: twill-probe
"#;

/// A slice of flannel's kube-flannel.yml: a Namespace and the objects that live in it, which a
/// dry run must check although the Namespace is never stored.
const DRY_RUN: &str = r#"
kind: Namespace
apiVersion: v1
metadata:
  name: kube-flannel
---
kind: ClusterRole
apiVersion: rbac.authorization.k8s.io/v1
metadata:
  name: flannel
rules:
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch"]
---
kind: ClusterRoleBinding
apiVersion: rbac.authorization.k8s.io/v1
metadata:
  name: flannel
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: flannel
subjects:
- kind: ServiceAccount
  name: flannel
  namespace: kube-flannel
---
kind: ConfigMap
apiVersion: v1
metadata:
  name: kube-flannel-cfg
  namespace: kube-flannel
data:
  net-conf.json: '{"Network": "10.244.0.0/16"}'
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: kube-flannel-ds
  namespace: kube-flannel
spec:
  selector:
    matchLabels: {app: flannel}
  template:
    metadata:
      labels: {app: flannel}
    spec:
      hostNetwork: true
      containers:
      - name: kube-flannel
        image: ghcr.io/flannel-io/flannel:v0.27.4
        securityContext:
          privileged: true
"#;

#[test]
fn kube_apiserver_keeps_nodes_across_restart_and_issues_service_account_tokens() {
    let lab = Lab::new(LabSpec {
        tag: "kubeh".into(),
        ..Default::default()
    })
    .unwrap();
    let host = lab.host(0);
    let etcd = Etcd::listening(Some(&host.ns), host.underlay_ip).unwrap();
    let mut kube = KubeApiServer::start(Some(&host.ns), host.underlay_ip, &etcd).unwrap();
    assert!(kube
        .url()
        .starts_with(&format!("https://{}:", host.underlay_ip)));

    let backend = "flannel.alpha.coreos.com/backend-type";
    kube.create_node("n1", Some("10.244.1.0/24"), &[(backend, "vxlan")])
        .unwrap();
    let node = kube.node("n1").unwrap();
    assert_eq!(pod_cidr(&node), "10.244.1.0/24");
    assert_eq!(annotation(&node, backend), Some("vxlan"));
    assert_eq!(annotation(&node, "node.alpha.kubernetes.io/ttl"), Some("0"));

    kube.patch_node_annotations("n1", &[(backend, None), ("twill/probe", Some("1"))])
        .unwrap();
    kube.set_pod_cidr("n1", "10.244.9.0/24").unwrap();
    let node = kube.node("n1").unwrap();
    assert_eq!(annotation(&node, backend), None);
    assert_eq!(annotation(&node, "twill/probe"), Some("1"));
    assert_eq!(pod_cidr(&node), "10.244.9.0/24");

    kube.stop().unwrap();
    assert!(kube.node("n1").is_err());
    kube.start_again().unwrap();
    assert_eq!(pod_cidr(&kube.node("n1").unwrap()), "10.244.9.0/24");

    kube.apply_yaml_dry_run(DRY_RUN).unwrap();
    assert!(kube
        .apply_yaml_dry_run("kind: Nonsense\napiVersion: v1\nmetadata: {name: x}")
        .is_err());
    kube.apply_yaml(PROBE_ACCOUNT).unwrap();
    let token = kube.service_account_token("twill-probe", "probe").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    kube.write_kubeconfig(&kubeconfig, &token).unwrap();
    // Known but not allowed: 403, where an unknown token would get 401.
    assert_eq!(get_node_status(&host.ns, &kubeconfig), 403);
    kube.write_kubeconfig(&kubeconfig, "not-a-token").unwrap();
    assert_eq!(get_node_status(&host.ns, &kubeconfig), 401);
    kube.delete_node("n1").unwrap();
    assert!(kube.node("n1").is_err());
}

fn pod_cidr(node: &Node) -> &str {
    let spec = node.spec.as_ref().unwrap();
    let cidr = spec.pod_cidr.as_deref().unwrap();
    assert_eq!(spec.pod_cidrs, Some(vec![cidr.to_string()]));
    cidr
}

fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The HTTP status of `GET` Node n1 with the kubeconfig at `path`, from inside `ns` as flanneld
/// would do it.
fn get_node_status(ns: &Netns, path: &Path) -> u16 {
    ns.enter(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let kubeconfig = Kubeconfig::read_from(path).unwrap();
            let options = KubeConfigOptions::default();
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .unwrap();
            let client = kube::Client::try_from(config).unwrap();
            match Api::<Node>::all(client).get("n1").await {
                Err(kube::Error::Api(status)) => status.code,
                other => panic!("expected an API error, got {other:?}"),
            }
        })
    })
}
