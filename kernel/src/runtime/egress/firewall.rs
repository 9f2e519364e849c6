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

/// Keeps the egress network from the host's ports but the proxy's.
pub fn confine(net: &EgressNetwork, port: u16) -> Result<(), String> {
    let (gw, port) = (net.gateway.to_string(), port.to_string());
    let accept = [
        "INPUT",
        "-i",
        &net.bridge,
        "-p",
        "tcp",
        "-d",
        &gw,
        "--dport",
        &port,
        "-j",
        "ACCEPT",
    ];
    let drop = ["INPUT", "-i", &net.bridge, "-j", "DROP"];
    let has_accept = iptables(&with("-C", &accept))?;
    let has_drop = iptables(&with("-C", &drop))?;
    if has_accept && has_drop {
        return Ok(());
    }
    // one without the other: both again, in order
    if has_accept {
        iptables(&with("-D", &accept))?;
    }
    if has_drop {
        iptables(&with("-D", &drop))?;
    }
    let mut insert_drop = vec!["-I", "INPUT", "1"];
    insert_drop.extend_from_slice(&drop[1..]);
    iptables(&insert_drop)?;
    let mut insert_accept = vec!["-I", "INPUT", "1"];
    insert_accept.extend_from_slice(&accept[1..]);
    iptables(&insert_accept)?;
    Ok(())
}
