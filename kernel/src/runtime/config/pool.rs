//! The warm pool's settings (SPEC §22): `OPKERNEL_POOL` containers kept
//! ready for the kernel's default profile, and for each profile listed in
//! `OPKERNEL_POOL_PROFILES`.

use sandbox::Profile;

/// How many unbound containers the pool keeps, and of which profiles.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolConfig {
    /// Unbound containers kept per pooled profile (0 turns the pool off).
    pub size: usize,
    /// The pooled profiles: the kernel's default first, then those of
    /// `OPKERNEL_POOL_PROFILES`, without repeats.
    pub profiles: Vec<Profile>,
}

impl PoolConfig {
    /// The default profile, then each `;`-separated entry of `listed`: a
    /// `,`-separated list of `memory_bytes=N`, `cpus=F`, `pids_limit=N`,
    /// `network=NAME`, `image=NAME` (one of `images`), `runtime=runc|runsc`
    /// over `base` (the
    /// limits a child envelope narrows, SPEC §26: the pool is kept per
    /// image and profile).
    pub fn profiles(
        base: &Profile,
        listed: &str,
        images: &super::Images,
    ) -> Result<Vec<Profile>, String> {
        let mut out = vec![base.clone()];
        for entry in listed.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let mut p = base.clone();
            for pair in entry.split(',').map(str::trim) {
                let (key, value) = pair
                    .split_once('=')
                    .ok_or_else(|| format!("{pair:?} is not key=value"))?;
                set(&mut p, key.trim(), value.trim(), images)?;
            }
            if p.runtime == sandbox::Runtime::Runsc && p.runs_as_root() {
                return Err(format!(
                    "{entry:?}: a runsc profile needs commands that do not run as root"
                ));
            }
            if p.runtime == sandbox::Runtime::Runsc && p.network != "none" {
                return Err(format!(
                    "{entry:?}: a runsc profile runs with network none, not {:?}",
                    p.network
                ));
            }
            if !out.contains(&p) {
                out.push(p);
            }
        }
        Ok(out)
    }
}

fn set(p: &mut Profile, key: &str, value: &str, images: &super::Images) -> Result<(), String> {
    let count = |v: &str| {
        v.parse::<i64>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{key} must be a positive integer, got {v:?}"))
    };
    match key {
        "memory_bytes" => p.memory_bytes = count(value)?,
        "pids_limit" => p.pids_limit = count(value)?,
        "cpus" => {
            let cpus = value
                .parse::<f64>()
                .ok()
                .filter(|c| c.is_finite() && *c > 0.0)
                .ok_or_else(|| format!("cpus must be a positive number, got {value:?}"))?;
            p.nano_cpus = (cpus * 1e9).round() as i64;
        }
        "network" if !value.is_empty() => p.network = value.to_owned(),
        "runtime" => {
            p.runtime = sandbox::Runtime::parse(value)
                .ok_or_else(|| format!("runtime must be runc or runsc, got {value:?}"))?
        }
        "image" => {
            p.image = images
                .reference(value)
                .ok_or_else(|| {
                    format!(
                        "image {value:?} is not one of OPKERNEL_IMAGES ({})",
                        images.names().join(", ")
                    )
                })?
                .to_owned()
        }
        _ => {
            return Err(format!(
                "unknown setting {key:?} (memory_bytes, cpus, pids_limit, network, image, runtime)"
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_profiles_narrow_the_default_and_bad_ones_are_named() {
        let base = Profile::default();
        let images = super::super::Images::parse("deb=img:debian", &base.image).unwrap();
        let got = PoolConfig::profiles(
            &base,
            " memory_bytes=1073741824, cpus=0.5 ;; pids_limit=64; image=deb; runtime=runsc",
            &images,
        )
        .unwrap();
        assert_eq!(got.len(), 5);
        assert_eq!(got[4].runtime, sandbox::Runtime::Runsc);
        assert_eq!(got[3].image, "img:debian");
        assert_eq!(got[0], base);
        assert_eq!(got[1].memory_bytes, 1 << 30);
        assert_eq!(got[1].nano_cpus, 500_000_000);
        assert_eq!(got[2].pids_limit, 64);
        assert_eq!(
            PoolConfig::profiles(&base, "", &images).unwrap(),
            vec![base.clone()]
        );
        for bad in [
            "memory=1",
            "cpus=-1",
            "pids_limit=x",
            "network=",
            "memory_bytes",
            "image=nope",
            "runtime=kata",
            "runtime=runsc,network=bridge",
        ] {
            assert!(PoolConfig::profiles(&base, bad, &images).is_err(), "{bad}");
        }
    }
}
