//! When the API server's history is not the one the watch follows: it answers that it does not
//! know the resourceVersion twill resumes from (newer than its own, "Too large resource
//! version"), or with a resourceVersion older than one twill has seen. Both happen when its
//! etcd lost its data or was restored from an older backup, and then resuming never catches
//! up: a watch from a version the server has not reached yet is accepted and stays silent (the
//! server sends only what is newer, bookmarks too) while Nodes come and go below it. So the
//! watch is started over with a fresh list, as client-go's reflector does for the first; for
//! the second twill asks the server its version ([`server_version`]) once it answers again
//! after the watch broke, and every few minutes besides.

use super::node_view::NodeView;
use kube::api::ListParams;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource};
use std::time::Duration;

/// How often the server's version is compared with the newest twill has seen while the watch
/// runs without a fault: a history that went back without breaking the watch (a restore under
/// running API servers) is found within this.
pub(super) const RECHECK: Duration = Duration::from_secs(300);

/// The newest resourceVersion the watch delivered since its last list.
#[derive(Debug, Default)]
pub(super) struct History {
    newest: Option<u64>,
}

impl History {
    /// Why the watch must list again, if the server's resourceVersion `version` is older than
    /// the newest twill has seen.
    pub fn behind(&self, version: u64) -> Option<String> {
        let newest = self.newest.filter(|newest| version < *newest)?;
        Some(format!(
            "the API server is at resourceVersion {version}, older than {newest} seen before"
        ))
    }

    /// Why the watch must list again, if `event` says the server's history went back; notes
    /// how far it has come otherwise. A list starts the count over: its Nodes come in any order.
    pub fn went_back(&mut self, event: &Event<NodeView>) -> Option<String> {
        let node = match event {
            Event::Init => {
                self.newest = None;
                return None;
            }
            Event::Apply(node) | Event::Delete(node) => node,
            // A list's Nodes come in any order; the newest of them still counts.
            Event::InitApply(node) => {
                let version = version(node)?;
                self.newest = self.newest.max(Some(version));
                return None;
            }
            Event::InitDone => return None,
        };
        let version = version(node)?;
        match self.newest {
            Some(newest) if version < newest => Some(format!(
                "the API server sent Node {} at resourceVersion {version}, older than {newest} \
                 seen before",
                node.name()
            )),
            _ => {
                self.newest = Some(version);
                None
            }
        }
    }
}

fn version(node: &NodeView) -> Option<u64> {
    node.meta().resource_version.as_deref()?.parse().ok()
}

/// The API server's resourceVersion now: a list of Node `own` alone, answered from its watch
/// cache (resourceVersion 0), as cheap as a list gets.
pub(super) async fn server_version(nodes: &Api<NodeView>, own: &str) -> Result<u64, String> {
    let params = ListParams::default()
        .fields(&format!("metadata.name={own}"))
        .match_any();
    let list = nodes
        .list_metadata(&params)
        .await
        .map_err(|e| e.to_string())?;
    let version = list.metadata.resource_version.unwrap_or_default();
    version
        .parse()
        .map_err(|_| format!("resourceVersion {version:?} is not a number"))
}

/// Why the watch must list again, if `error` is the API server saying it does not have the
/// resourceVersion the watch resumes from yet (client-go's `isTooLargeResourceVersionError`:
/// the cause ResourceVersionTooLarge, or an older server's message).
pub(super) fn unknown_version(error: &watcher::Error) -> Option<String> {
    let status = match error {
        watcher::Error::WatchError(status) => status.as_ref(),
        watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.as_ref(),
        _ => return None,
    };
    let causes = status.details.as_ref().map(|d| d.causes.as_slice());
    let too_large = causes
        .unwrap_or_default()
        .iter()
        .any(|c| c.reason == "ResourceVersionTooLarge")
        || status.message.contains("Too large resource version");
    too_large.then(|| {
        format!(
            "the API server does not know the watch's resourceVersion ({})",
            status.message
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, version: &str) -> NodeView {
        let json = serde_json::json!({
            "metadata": {"name": name, "resourceVersion": version},
        });
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_change_older_than_one_seen_is_a_history_gone_back_and_a_list_starts_over() {
        let mut history = History::default();
        assert_eq!(history.went_back(&Event::Apply(node("a", "500"))), None);
        assert_eq!(history.went_back(&Event::Delete(node("b", "501"))), None);
        let why = history.went_back(&Event::Apply(node("c", "40"))).unwrap();
        assert!(
            why.contains("Node c at resourceVersion 40, older than 501"),
            "{why}"
        );
        history.went_back(&Event::Init);
        assert_eq!(history.went_back(&Event::InitApply(node("c", "40"))), None);
        assert_eq!(history.went_back(&Event::Apply(node("d", "41"))), None);
        // Not a number: resourceVersions are opaque to the API, so nothing is concluded.
        assert_eq!(history.went_back(&Event::Apply(node("e", "x"))), None);
        assert_eq!(history.behind(41), None);
        let why = history.behind(7).unwrap();
        assert!(why.contains("resourceVersion 7, older than 41"), "{why}");
        history.went_back(&Event::Init);
        history.went_back(&Event::InitApply(node("f", "90")));
        history.went_back(&Event::InitApply(node("g", "60")));
        assert!(history.behind(80).is_some(), "the newest of a list counts");
    }

    #[test]
    fn too_large_resource_version_is_recognised_by_cause_or_message() {
        let status = |message: &str, cause: Option<&str>| {
            let mut json =
                serde_json::json!({"code": 504, "reason": "Timeout", "message": message});
            if let Some(cause) = cause {
                json["details"] = serde_json::json!({"causes": [{"reason": cause}]});
            }
            Box::new(serde_json::from_value::<kube::core::Status>(json).unwrap())
        };
        let by_cause =
            watcher::Error::WatchError(status("timeout", Some("ResourceVersionTooLarge")));
        assert!(unknown_version(&by_cause).is_some());
        let by_message = watcher::Error::WatchError(status(
            "Too large resource version: 900, current: 120",
            None,
        ));
        assert!(unknown_version(&by_message)
            .unwrap()
            .contains("current: 120"));
        let gone = watcher::Error::WatchError(status("too old resource version", None));
        assert_eq!(unknown_version(&gone), None);
    }
}
