//! `kubectl apply --server-side` for multi-document manifests such as flannel's kube-flannel.yml.

use super::KubeApiServer;
use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{self, Scope};
use kube::Client;
use serde_json::Value;

const FIELD_MANAGER: &str = "twill-lab";

impl KubeApiServer {
    /// Server-side applies every document of `yaml`, in order (so a Namespace before what lives
    /// in it), taking ownership of conflicting fields as `kubectl apply --force-conflicts` does.
    pub fn apply_yaml(&self, yaml: &str) -> Result<()> {
        self.apply(yaml, false)
    }

    /// [`KubeApiServer::apply_yaml`] with `dryRun=All`: the server validates and admits each
    /// object but stores nothing. It refuses objects in a namespace that does not exist even then,
    /// so an object in a Namespace that `yaml` itself declares but that does not exist yet is
    /// checked in `default` instead.
    pub fn apply_yaml_dry_run(&self, yaml: &str) -> Result<()> {
        self.apply(yaml, true)
    }

    fn apply(&self, yaml: &str, dry_run: bool) -> Result<()> {
        let docs = yaml_documents(yaml)?;
        let declared = declared_namespaces(&docs);
        self.block_on(|client| async move {
            for (i, doc) in docs.into_iter().enumerate() {
                let what = describe(&doc);
                let doc = match dry_run {
                    true => in_existing_namespace(&client, doc, &declared).await?,
                    false => doc,
                };
                apply_one(&client, &doc, dry_run)
                    .await
                    .with_context(|| format!("document {i} ({what})"))?;
            }
            Ok(())
        })
        .with_context(|| format!("cannot apply{}", if dry_run { " (dry run)" } else { "" }))
    }
}

/// The documents of a multi-document manifest as JSON values, empty ones left out: what
/// [`KubeApiServer::apply_yaml`] applies, for a test to change before applying them (each
/// written back as JSON, which is YAML).
pub fn yaml_documents(yaml: &str) -> Result<Vec<Value>> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).context("invalid YAML")?;
    Ok(docs.into_iter().filter(|doc| !doc.is_null()).collect())
}

async fn apply_one(client: &Client, doc: &Value, dry_run: bool) -> Result<()> {
    let field = |name: &str| doc[name].as_str().with_context(|| format!("no {name}"));
    let (api_version, kind) = (field("apiVersion")?, field("kind")?);
    let name = doc["metadata"]["name"]
        .as_str()
        .context("no metadata.name")?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = discovery::pinned_kind(client, &gvk).await?;
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Cluster => Api::all_with(client.clone(), &resource),
        Scope::Namespaced => Api::namespaced_with(client.clone(), namespace(doc), &resource),
    };
    let mut params = PatchParams::apply(FIELD_MANAGER).force();
    if dry_run {
        params = params.dry_run();
    }
    api.patch(name, &params, &Patch::Apply(doc)).await?;
    Ok(())
}

/// Moves `doc` to `default` if its namespace is one of `declared` and does not exist.
async fn in_existing_namespace(
    client: &Client,
    mut doc: Value,
    declared: &[String],
) -> Result<Value> {
    let ns = namespace(&doc).to_string();
    if declared.contains(&ns)
        && Api::<Namespace>::all(client.clone())
            .get_opt(&ns)
            .await?
            .is_none()
    {
        doc["metadata"]["namespace"] = "default".into();
    }
    Ok(doc)
}

fn declared_namespaces(docs: &[Value]) -> Vec<String> {
    docs.iter()
        .filter(|doc| doc["apiVersion"] == "v1" && doc["kind"] == "Namespace")
        .filter_map(|doc| Some(doc["metadata"]["name"].as_str()?.to_string()))
        .collect()
}

/// Where a namespaced object goes; `default` if it does not say, as with kubectl.
fn namespace(doc: &Value) -> &str {
    doc["metadata"]["namespace"].as_str().unwrap_or("default")
}

/// `Kind name` for error messages.
fn describe(doc: &Value) -> String {
    let text = |v: &Value| v.as_str().unwrap_or("?").to_string();
    format!("{} {}", text(&doc["kind"]), text(&doc["metadata"]["name"]))
}
