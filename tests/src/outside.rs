//! An "outside" for egress tests (SPEC §27), without leaving the machine:
//! a container of the test's own on a network of its own, serving HTTP on
//! 8080 and HTTPS on 8443 (a certificate for `outside.test` and
//! `other.test` made here by `openssl`, signed by a CA of the test's own),
//! and logging every UDP packet it gets on 9999. Names reach it through
//! `OPKERNEL_EGRESS_HOSTS`, never DNS.

use std::path::PathBuf;
use std::process::Command;

/// The server: `GET /bytes/N` answers N bytes; anything else names the
/// `Host` and path it was asked for.
const SERVER: &str = r#"
import http.server, socket, ssl, threading
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.path.startswith("/bytes/"):
            n = int(self.path[7:])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            chunk = b"x" * 65536
            while n > 0:
                k = min(n, len(chunk))
                self.wfile.write(chunk[:k])
                n -= k
            return
        body = ("outside:" + self.headers.get("Host", "") + self.path + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
def serve(port, tls):
    s = http.server.ThreadingHTTPServer(("0.0.0.0", port), H)
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain("/certs/server.pem", "/certs/server.key")
        s.socket = ctx.wrap_socket(s.socket, server_side=True)
    s.serve_forever()
def udp():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("0.0.0.0", 9999))
    while True:
        data, peer = u.recvfrom(2048)
        with open("/tmp/udp.log", "a") as f:
            f.write(peer[0] + "\n")
threading.Thread(target=serve, args=(8443, True), daemon=True).start()
threading.Thread(target=udp, daemon=True).start()
serve(8080, False)
"#;

/// The outside server, removed (with its network) when dropped.
pub struct Outside {
    /// Its network.
    pub network: String,
    /// Its container.
    pub container: String,
    /// Its address on its network.
    pub ip: String,
    /// The CA's certificate (PEM), for `curl --cacert`.
    pub ca_pem: String,
    dir: PathBuf,
}

use crate::certs::run;

/// A CA and a server certificate for `outside.test` and `other.test`
/// (`ca.pem`, `server.pem`, `server.key`).
fn certificates(dir: &std::path::Path) -> anyhow::Result<()> {
    crate::certs::ca(dir, "ca")?;
    crate::certs::server(dir, "ca", "server", &["DNS:outside.test", "DNS:other.test"])?;
    Ok(())
}

impl Outside {
    /// Starts it on a fresh network of its own, from `image` (one with
    /// python3), its ports answering.
    pub fn start(image: &str) -> anyhow::Result<Outside> {
        let tag = uuid::Uuid::new_v4().simple().to_string()[..10].to_owned();
        // named before anything is made: a start that fails midway leaves
        // nothing behind (its drop removes what was made)
        let name = format!("okt-outside-{tag}");
        let mut outside = Outside {
            network: name.clone(),
            container: name.clone(),
            ip: String::new(),
            ca_pem: String::new(),
            dir: std::env::temp_dir().join(format!("opkernel-outside-{tag}")),
        };
        std::fs::create_dir_all(&outside.dir)?;
        certificates(&outside.dir)?;
        run(Command::new("docker").args(["network", "create", &name]))?;
        outside.container = run(Command::new("docker")
            .args(["run", "-d", "--name", &name, "--network", &name])
            .args(["--label", "opkernel.test=outside", "-v"])
            .arg(format!("{}:/certs:ro", outside.dir.display()))
            .args([image, "python3", "-c", SERVER]))?;
        outside.ip = run(Command::new("docker").args([
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            &outside.container,
        ]))?;
        outside.ca_pem = std::fs::read_to_string(outside.dir.join("ca.pem"))?;
        outside.wait_ready()?;
        Ok(outside)
    }

    fn wait_ready(&self) -> anyhow::Result<()> {
        for _ in 0..100 {
            let probe = std::net::TcpStream::connect_timeout(
                &format!("{}:8080", self.ip).parse()?,
                std::time::Duration::from_millis(200),
            );
            if probe.is_ok() {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        anyhow::bail!("the outside server at {} never answered", self.ip)
    }

    /// `OPKERNEL_EGRESS_HOSTS` naming it `outside.test` and `other.test`.
    pub fn hosts(&self) -> String {
        format!("outside.test={ip};other.test={ip}", ip = self.ip)
    }

    /// The UDP packets it got, by sender.
    pub fn udp_senders(&self) -> Vec<String> {
        let out = Command::new("docker")
            .args([
                "exec",
                &self.container,
                "sh",
                "-c",
                "cat /tmp/udp.log 2>/dev/null || true",
            ])
            .output();
        out.map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", &self.container])
            .output();
        let _ = Command::new("docker")
            .args(["network", "rm", &self.network])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
