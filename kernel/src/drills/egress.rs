//! The egress drill (SPEC §27): a run with an allow list tries the usual
//! ways around the kernel's proxy, and each must fail, while the proxy
//! itself answers (so a broken probe cannot pass as a blocked one).

use std::net::{TcpListener, UdpSocket};
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use super::harness::KernelProcess;
use super::{check, unique_run, Kit};

/// The port the peer run listens on.
const PEER_PORT: u16 = 7000;

/// The probes, one line each (`NAME reached|blocked`), in bash: both run
/// images have it (the default one as a static binary), with `timeout`;
/// the shell's own notes (busybox `timeout` kills: `Terminated`) go nowhere.
const PROBES: &str = r#"
exec 2>/dev/null
probe() { if timeout 3 bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null; then echo "$1 reached"; else echo "$1 blocked"; fi; }
probe proxy "$GW" "$PROXY_PORT"
probe gateway-port "$GW" "$HOST_PORT"
probe gateway-docker-tcp "$GW" 2375
probe docker0-port "$DOCKER0" "$HOST_PORT"
probe docker0-docker-tcp "$DOCKER0" 2375
probe other-container "$PEER" "$PEER_PORT"
probe ipv4-mapped "::ffff:$GW" "$HOST_PORT"
if [ -e /var/run/docker.sock ] || [ -e /run/docker.sock ]; then echo "docker-socket reached"; else echo "docker-socket blocked"; fi
if [ -s /proc/net/if_inet6 ] && grep -qv ' lo$' /proc/net/if_inet6; then echo "ipv6-address reached"; else echo "ipv6-address blocked"; fi
if command -v python3 >/dev/null 2>&1; then
  if python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)' 2>/dev/null; then echo "raw-socket reached"; else echo "raw-socket blocked"; fi
elif ping -c 1 -W 1 "$GW" >/dev/null 2>&1; then echo "raw-socket reached"; else echo "raw-socket blocked"; fi
echo udp >"/dev/udp/$GW/$HOST_UDP" 2>/dev/null
echo udp >"/dev/udp/$DOCKER0/$HOST_UDP" 2>/dev/null
echo done
"#;

/// A run on the egress network whose command listens on [`PEER_PORT`]
/// (python3 where the image has it, else busybox `nc`).
const PEER: &str = "if command -v python3 >/dev/null 2>&1; then exec python3 -m http.server 7000; \
                    else exec nc -ll -p 7000 -e cat; fi";

/// What the host offers the probes: a TCP and a UDP port on every
/// address, the probes must reach neither.
struct HostBait {
    tcp: TcpListener,
    udp: UdpSocket,
}

impl HostBait {
    fn bind() -> anyhow::Result<Self> {
        let tcp = TcpListener::bind("0.0.0.0:0")?;
        tcp.set_nonblocking(true)?;
        let udp = UdpSocket::bind("0.0.0.0:0")?;
        udp.set_nonblocking(true)?;
        Ok(Self { tcp, udp })
    }

    /// What reached it: an accepted connection, a datagram.
    fn touched(&self) -> Vec<String> {
        let mut seen = Vec::new();
        while let Ok((_, from)) = self.tcp.accept() {
            seen.push(format!("a TCP connection from {from}"));
        }
        let mut buf = [0u8; 64];
        while let Ok((_, from)) = self.udp.recv_from(&mut buf) {
            seen.push(format!("a UDP datagram from {from}"));
        }
        seen
    }
}

/// A foreground bash script in `run`: its output (its exit code must be 0).
async fn sh(k: &KernelProcess, run: &str, script: &str) -> anyhow::Result<String> {
    let body = json!({"command": ["bash", "-c", script], "timeout_sec": 120});
    let v = k
        .client
        .post(&format!("/v1/runs/{run}/tools/run_command"), &body)
        .await?;
    check(v["exit_code"] == 0, || format!("{script:.60}…: {v}"))?;
    Ok(v["output"].as_str().unwrap_or_default().to_owned())
}

/// The default bridge's gateway (the host's `docker0` address): as the
/// engine names it, else its subnet's first address (some engines leave
/// the default bridge's gateway out of its IPAM record).
fn docker0() -> anyhow::Result<String> {
    let format = "{{range .IPAM.Config}}{{.Gateway}} {{.Subnet}}{{end}}";
    let out = Command::new("docker")
        .args(["network", "inspect", "-f", format, "bridge"])
        .output()?;
    let said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let mut words = said.split_whitespace();
    let (first, second) = (words.next(), words.next());
    let gateway = match (first, second) {
        (Some(gw), Some(_)) => Some(gw.to_owned()),
        (Some(subnet), None) => subnet
            .split('/')
            .next()
            .and_then(|a| a.parse::<std::net::Ipv4Addr>().ok())
            .map(|a| std::net::Ipv4Addr::from(u32::from(a) + 1).to_string()),
        _ => None,
    };
    gateway.ok_or_else(|| {
        anyhow::anyhow!(
            "no gateway for Docker's bridge network: {said:?} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The container's address on its network.
fn address_of(container: &str) -> anyhow::Result<String> {
    let format = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}";
    let out = Command::new("docker")
        .args(["inspect", "-f", format, container])
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Makes a run whose network is an allow list.
async fn listed_run(k: &KernelProcess, tag: &str) -> anyhow::Result<String> {
    let run = unique_run(tag);
    let body = json!({"run_id": run, "envelope": {"network": {"allow": ["allowed.invalid:443"]}}});
    k.client.post("/v1/runs", &body).await?;
    Ok(run)
}

/// The peer listens, and reaches itself on its own address (the control:
/// the listener is there to be found); its address.
async fn peer(k: &KernelProcess) -> anyhow::Result<String> {
    let run = listed_run(k, "egress-peer").await?;
    let op = k.start_bg(&run, &["sh", "-c", PEER], 600).await?;
    let ip = address_of(&k.container_of(&op).await?)?;
    let own = format!(
        "for i in $(seq 50); do timeout 2 bash -c 'exec 3<>/dev/tcp/{ip}/{PEER_PORT}' 2>/dev/null && exit 0; sleep 0.2; done; exit 1"
    );
    sh(k, &run, &own).await?;
    Ok(ip)
}

/// `egress-bypass`: the probes from an allow-list run; each escape is
/// blocked, the proxy is reached, and nothing reached the host's bait.
pub async fn egress_bypass(kit: &Kit) -> anyhow::Result<String> {
    if super::env_runtime() == sandbox::Runtime::Runsc {
        return gvisor_has_no_network(kit).await;
    }
    let k = kit.start("egress-bypass", &[]).await?;
    let bait = HostBait::bind()?;
    let peer_ip = peer(&k).await?;
    let run = listed_run(&k, "egress-probe").await?;
    let proxy = sh(&k, &run, "echo $HTTP_PROXY").await?;
    let (gw, proxy_port) = proxy
        .trim()
        .trim_start_matches("http://")
        .split_once(':')
        .ok_or_else(|| anyhow::anyhow!("no proxy in the command's environment: {proxy:?}"))?;
    let env = [
        format!("GW={gw}"),
        format!("PROXY_PORT={proxy_port}"),
        format!("HOST_PORT={}", bait.tcp.local_addr()?.port()),
        format!("HOST_UDP={}", bait.udp.local_addr()?.port()),
        format!("DOCKER0={}", docker0()?),
        format!("PEER={peer_ip}"),
        format!("PEER_PORT={PEER_PORT}"),
    ];
    // the values are addresses and ports: set as shell variables
    let said = sh(&k, &run, &format!("{}\n{PROBES}", env.join("\n"))).await?;
    check(said.lines().last() == Some("done"), || {
        format!("the probes stopped: {said}")
    })?;
    let mut blocked = Vec::new();
    for line in said.lines().filter(|l| *l != "done") {
        match line.split_once(' ') {
            Some(("proxy", "reached")) => {}
            Some(("proxy", _)) => anyhow::bail!("the proxy itself was not reached: {said}"),
            Some((name, "blocked")) => blocked.push(name.to_owned()),
            _ => anyhow::bail!("escaped: {line} (all: {said})"),
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let touched = bait.touched();
    check(touched.is_empty(), || {
        format!("the host was reached: {touched:?}")
    })?;
    Ok(format!(
        "the proxy answered; blocked: {}, UDP to the host",
        blocked.join(", ")
    ))
}

/// `egress-bypass` under gVisor (SPEC §30): a runsc run has network
/// `none`, so an allow list is refused at the run's creation, naming the
/// runtime, and a command finds no way out: the host's bait on `docker0`
/// is not reached.
async fn gvisor_has_no_network(kit: &Kit) -> anyhow::Result<String> {
    let k = kit.start("egress-runsc", &[]).await?;
    let body = json!({"run_id": unique_run("egress-runsc"), "envelope": {"network": {"allow": ["allowed.invalid:443"]}}});
    let (status, said) = k
        .client
        .request(reqwest::Method::POST, "/v1/runs", Some(&body), &[])
        .await?;
    check(status == 400 && said.to_string().contains("runsc"), || {
        format!("an allow list on a runsc run was not refused: {status} {said}")
    })?;
    let bait = HostBait::bind()?;
    let run = unique_run("egress-runsc-none");
    k.client.post("/v1/runs", &json!({"run_id": run})).await?;
    let port = bait.tcp.local_addr()?.port();
    let script = format!(
        "timeout 3 bash -c 'exec 3<>/dev/tcp/{}/{port}' 2>/dev/null && echo reached || echo blocked",
        docker0()?
    );
    let out = sh(&k, &run, &script).await?;
    check(out.trim() == "blocked", || {
        format!("a runsc command reached the host: {out}")
    })?;
    let touched = bait.touched();
    check(touched.is_empty(), || {
        format!("the host's bait was reached: {touched:?}")
    })?;
    Ok("runsc: an allow list is refused at creation (400, naming the runtime); a command reaches nothing (network none)".into())
}
