//! The host side of the egress network: a container on it reaches the
//! host's address there (Docker gives an internal network a gateway), so
//! every packet from its bridge to the host is dropped but the proxy's
//! port. Two `iptables` rules on `INPUT`, put in place once (checked,
//! then inserted: the accept rule above the drop).

use std::process::Command;

use sandbox::egress::EgressNetwork;

/// One `iptables` call; whether it succeeded, or its error output.
fn iptables(args: &[&str]) -> Result<bool, String> {
    let out = Command::new("iptables")
        .args(args)
        .output()
        .map_err(|e| format!("iptables: {e} (the egress proxy needs it, as Docker does)"))?;
    if out.status.success() {
        return Ok(true);
    }
    // `-C` answers 1 for a missing rule; anything else is an error
    if args.first() == Some(&"-C") && out.status.code() == Some(1) {
        return Ok(false);
    }
    Err(format!(
        "iptables {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

fn with<'a>(op: &'a str, rule: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![op];
    args.extend_from_slice(rule);
    args
}

/// Keeps the egress network from the host's ports but the proxy's, and
/// every other interface from the proxy: three rules at the head of
/// `INPUT` (accept the bridge to the proxy, drop the rest of the bridge,
/// drop the proxy's port from anywhere else), checked and, when any is
/// missing (a firewall reload flushed them), all put back in order; and
/// the bridge's IPv6 dropped (`ip6tables`, where the host has it: the
/// network has no IPv6, this is a second line). Whether anything was put
/// back.
pub fn confine(net: &EgressNetwork, port: u16) -> Result<bool, String> {
    let (gw, port) = (net.gateway.to_string(), port.to_string());
    let bridge = net.bridge.as_str();
    let to_proxy = ["-p", "tcp", "-d", gw.as_str(), "--dport", port.as_str()];
    let mut accept = vec!["INPUT", "-i", bridge];
    accept.extend_from_slice(&to_proxy);
    accept.extend_from_slice(&["-j", "ACCEPT"]);
    let drop_bridge = vec!["INPUT", "-i", bridge, "-j", "DROP"];
    let mut drop_others = vec!["INPUT", "!", "-i", bridge];
    drop_others.extend_from_slice(&to_proxy);
    drop_others.extend_from_slice(&["-j", "DROP"]);
    let rules = [accept, drop_bridge, drop_others];
    let mut present = Vec::new();
    for rule in &rules {
        present.push(iptables(&with("-C", rule))?);
    }
    if present.iter().all(|p| *p) {
        return Ok(false);
    }
    for (rule, here) in rules.iter().zip(&present) {
        if *here {
            iptables(&with("-D", rule))?;
        }
    }
    // inserted at the head in reverse: accept, drop the bridge, drop others
    for rule in rules.iter().rev() {
        let mut insert = vec!["-I", "INPUT", "1"];
        insert.extend_from_slice(&rule[1..]);
        iptables(&insert)?;
    }
    confine_v6(bridge);
    Ok(true)
}

/// The bridge's IPv6 dropped on `INPUT` and `FORWARD`, where `ip6tables`
/// works (a warning where it does not: the network has no IPv6 anyway).
fn confine_v6(bridge: &str) {
    for chain in ["INPUT", "FORWARD"] {
        let rule = [chain, "-i", bridge, "-j", "DROP"];
        let run = |op: &str| {
            Command::new("ip6tables")
                .arg(op)
                .args(rule)
                .output()
                .map(|o| o.status.success())
        };
        match run("-C") {
            Ok(true) => {}
            _ => {
                if !matches!(run("-I"), Ok(true)) {
                    tracing::warn!(%bridge, "ip6tables: no IPv6 drop rule for the egress bridge (its network has no IPv6)");
                }
            }
        }
    }
}
