//! Recovery drills (filled in below).

pub async fn run_cli(_name: &str, _json: bool) -> anyhow::Result<i32> {
    anyhow::bail!("drills are not built yet")
}
