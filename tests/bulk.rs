//! Plain iperf3 TCP through both userspace backends, a few runs each: the kernel must never
//! refuse one of twill's sends. A send of one GSO train too big for the kernel once lost
//! whole trains of ~45 packets in about a third of such runs (each a TCP retransmit burst).

mod common;

use anyhow::{Context, Result};
use common::*;
use std::time::Duration;

const RUNS: usize = 3;
const SECONDS: &str = "3";

#[test]
fn iperf3_runs_cost_no_refused_sends_on_either_backend() -> Result<()> {
    for (tag, backend) in [("ibulku", "udp"), ("ibulkb", "batch")] {
        let pair = start_pair(tag, &["--backend", backend], None)?;
        let (a, b) = (pair.container(0), pair.container(1));
        let mut server = b.ns.spawn("iperf3", &["-s", "-B", &b.ip.to_string()])?;
        std::thread::sleep(Duration::from_millis(300));
        let mut retransmits = Vec::new();
        for _ in 0..RUNS {
            let ip = b.ip.to_string();
            let out = a.ns.exec("iperf3", &["-c", &ip, "-t", SECONDS, "-J"])?;
            let json: serde_json::Value = serde_json::from_str(&out)?;
            let sent = json.pointer("/end/sum_sent/retransmits");
            retransmits.push(sent.and_then(|r| r.as_u64()).context("retransmits")?);
        }
        server.stop()?;
        for host in 0..2 {
            let refused = drops(&pair.host(host).ns, "io_error")?;
            anyhow::ensure!(
                refused == 0,
                "{backend}: host {host} counted {refused} io_error drops; retransmits per run {retransmits:?}"
            );
        }
        println!("{backend}: TCP retransmits per run {retransmits:?}, io_error 0");
    }
    Ok(())
}
