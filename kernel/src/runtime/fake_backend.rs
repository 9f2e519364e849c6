//! A scripted backend for the kernel's unit tests: real `.ops` files under
//! a temporary root, containers and launches kept in memory, and each start
//! doing what the test asked (exit with a code, run until signalled, be
//! refused, vanish). The executor's tests drive the real control plane and
//! observers against it.

use std::collections::HashMap;
use std::path::PathBuf;

use futures::future::BoxFuture;
use sandbox::backend::prelude::*;
use sandbox::{
    ContainerInfo, LaunchSpec, MarkedProcess, OpsDir, PidRecord, Profile, RunIdentity, RunUser,
    SandboxError, Signal, TopProcess,
};

use crate::base::sync::Lock;

/// What the fake does when a launch is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnStart {
    /// The wrapper records its pid and the command exits with this code.
    Exit(i32),
    /// The wrapper records its pid; the command runs until signalled (then 143).
    RunUntilSignalled,
    /// The engine answers 400: nothing ran.
    Refuse,
    /// The request times out and nothing ever runs.
    Vanish,
}

pub(crate) const WRAPPER_PID: u32 = 4242;

/// The fake container's resident launcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Launcher {
    /// Containers have none: every op goes by exec.
    None,
    /// It claims each request and starts it as `on_start` says.
    Claims,
    /// It exists but never claims anything (hung, or gone).
    Silent,
}

pub(crate) struct Fake {
    pub(crate) root: PathBuf,
    pub(crate) on_start: OnStart,
    pub(crate) launcher: Launcher,
    /// Container ids by name.
    pub(crate) containers: Lock<HashMap<String, ContainerInfo>>,
    /// (launch id, op id) in creation order.
    pub(crate) launches: Lock<Vec<(String, String)>>,
    pub(crate) starts: Lock<Vec<String>>,
    /// Ops whose wrapper is alive, with its identity.
    pub(crate) alive: Lock<HashMap<String, PidRecord>>,
    pub(crate) signals: Lock<Vec<(String, u32, Signal)>>,
    /// Ops the fake launcher claimed.
    pub(crate) claims: Lock<Vec<String>>,
}

impl Fake {
    pub(crate) fn new(root: PathBuf, on_start: OnStart, launcher: Launcher) -> Fake {
        Fake {
            root,
            on_start,
            launcher,
            containers: Lock::default(),
            launches: Lock::default(),
            starts: Lock::default(),
            alive: Lock::default(),
            signals: Lock::default(),
            claims: Lock::default(),
        }
    }

    pub(crate) fn op_of(&self, launch_id: &str) -> Option<String> {
        self.launches
            .lock()
            .iter()
            .find(|(id, _)| id == launch_id)
            .map(|(_, op)| op.clone())
    }

    /// The `.ops` dir of the test's run (every fake container of a test
    /// belongs to one run).
    pub(crate) fn run_ops(&self) -> OpsDir {
        let key = self
            .containers
            .lock()
            .values()
            .next()
            .and_then(|c| c.labels.get(sandbox::profile::LABEL_SCRATCH_KEY).cloned())
            .unwrap_or_default();
        self.ops_dir(&key)
    }

    /// What the command does once started (by exec or by the launcher).
    pub(crate) fn run(&self, op: &str) {
        let pid_line = format!("{WRAPPER_PID} 7 box\n");
        match self.on_start {
            OnStart::Exit(code) => {
                self.write(op, "pid", &pid_line);
                self.write(op, "code", &format!("{code}\n"));
            }
            OnStart::RunUntilSignalled => {
                self.write(op, "pid", &pid_line);
                self.alive.lock().insert(
                    op.to_owned(),
                    PidRecord {
                        pid: WRAPPER_PID,
                        start_ticks: 7,
                        hostname: "box".into(),
                    },
                );
            }
            OnStart::Refuse | OnStart::Vanish => {}
        }
    }

    /// One pass of the fake launcher over the inbox: claims by rename, as
    /// the real one does, and runs what it claimed.
    pub(crate) fn claim_pending(&self) -> usize {
        let inbox = self.run_ops().path().join("inbox");
        let Ok(entries) = std::fs::read_dir(&inbox) else {
            return 0;
        };
        let mut claimed = 0;
        for name in entries.filter_map(|e| e.ok()?.file_name().into_string().ok()) {
            let Some(op) = name.strip_suffix(".req") else {
                continue;
            };
            if std::fs::rename(inbox.join(&name), inbox.join(format!("{op}.claimed"))).is_ok() {
                self.claims.lock().push(op.to_owned());
                self.run(op);
                claimed += 1;
            }
        }
        claimed
    }

    pub(crate) fn write(&self, op_id: &str, ext: &str, text: &str) {
        let dir = self.run_ops();
        let tmp = dir.path().join(format!("{op_id}.{ext}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, dir.path().join(format!("{op_id}.{ext}"))).unwrap();
    }
}

pub(crate) fn ready<'a, T: Send + 'a>(v: sandbox::Result<T>) -> BoxFuture<'a, sandbox::Result<T>> {
    Box::pin(async move { v })
}

impl Containers for Fake {
    fn owns(&self, _info: &ContainerInfo) -> bool {
        true
    }
    fn check_run_user<'a>(&'a self, _: &'a Profile) -> BoxFuture<'a, sandbox::Result<RunUser>> {
        ready(Ok(RunUser {
            uid: 1000,
            gid: 1000,
        }))
    }
    fn ensure_container<'a>(
        &'a self,
        identity: &'a RunIdentity,
        _: &'a Profile,
    ) -> BoxFuture<'a, sandbox::Result<ContainerInfo>> {
        std::fs::create_dir_all(self.ops_dir(&identity.scratch_key).path().join("inbox")).unwrap();
        let info = self
            .containers
            .lock()
            .entry(identity.name.clone())
            .or_insert_with(|| ContainerInfo {
                id: format!("c-{}", identity.run_id),
                name: identity.name.clone(),
                labels: identity.labels(0),
                running: true,
                hostname: "box".into(),
                state: "running".into(),
                scratch_source: None,
                has_shim: true,
                has_launcher: self.launcher != Launcher::None,
            })
            .clone();
        ready(Ok(info))
    }
    fn inspect<'a>(&'a self, id: &'a str) -> BoxFuture<'a, sandbox::Result<ContainerInfo>> {
        let found = self
            .containers
            .lock()
            .values()
            .find(|c| c.id == id)
            .cloned();
        ready(found.ok_or_else(|| SandboxError::NotFound(id.into())))
    }
    fn list_managed(&self) -> BoxFuture<'_, sandbox::Result<Vec<ContainerInfo>>> {
        ready(Ok(self.containers.lock().values().cloned().collect()))
    }
    fn top<'a>(&'a self, _: &'a str) -> BoxFuture<'a, sandbox::Result<Vec<TopProcess>>> {
        ready(Ok(Vec::new()))
    }
    fn remove<'a>(&'a self, id: &'a str) -> BoxFuture<'a, sandbox::Result<bool>> {
        let mut containers = self.containers.lock();
        let before = containers.len();
        containers.retain(|_, c| c.id != id);
        ready(Ok(containers.len() < before))
    }
}

impl Launches for Fake {
    fn create_launch<'a>(
        &'a self,
        _container_id: &'a str,
        spec: &'a LaunchSpec<'a>,
        _command: &'a [String],
    ) -> BoxFuture<'a, sandbox::Result<String>> {
        let mut launches = self.launches.lock();
        let id = format!("launch-{}", launches.len());
        launches.push((id.clone(), spec.op_id.to_owned()));
        ready(Ok(id))
    }
    fn start_launch<'a>(&'a self, launch_id: &'a str) -> BoxFuture<'a, sandbox::Result<()>> {
        self.starts.lock().push(launch_id.to_owned());
        let op = self.op_of(launch_id).unwrap_or_default();
        match self.on_start {
            OnStart::Exit(_) | OnStart::RunUntilSignalled => {
                self.run(&op);
                ready(Ok(()))
            }
            OnStart::Refuse => ready(Err(SandboxError::Refused {
                status: 400,
                message: "no such user".into(),
            })),
            OnStart::Vanish => ready(Err(SandboxError::Unreachable("timed out".into()))),
        }
    }
    fn launch_status<'a>(&'a self, _: &'a str) -> BoxFuture<'a, sandbox::Result<Option<i64>>> {
        ready(Ok(None))
    }
}

impl Processes for Fake {
    fn probe<'a>(&'a self, _: &'a str) -> BoxFuture<'a, sandbox::Result<Vec<MarkedProcess>>> {
        let procs = self
            .alive
            .lock()
            .iter()
            .map(|(op, rec)| MarkedProcess {
                pid: rec.pid,
                start_ticks: rec.start_ticks,
                op_id: op.clone(),
            })
            .collect();
        ready(Ok(procs))
    }
    fn signal_op<'a>(
        &'a self,
        _container_id: &'a str,
        op_id: &'a str,
        record: &'a PidRecord,
        signal: Signal,
    ) -> BoxFuture<'a, sandbox::Result<Vec<u32>>> {
        self.signals
            .lock()
            .push((op_id.to_owned(), record.pid, signal));
        // the command dies of TERM; its wrapper records 143 and exits
        let was_alive = self.alive.lock().remove(op_id).is_some();
        if was_alive {
            self.write(op_id, "code", "143\n");
        }
        ready(Ok(if was_alive {
            vec![record.pid + 1]
        } else {
            vec![]
        }))
    }
}

impl Scratch for Fake {
    fn ops_dir(&self, scratch_key: &str) -> OpsDir {
        OpsDir::new(self.root.join(scratch_key).join(".ops"))
    }
    fn remove_scratch(&self, scratch_key: &str) -> sandbox::Result<()> {
        let _ = std::fs::remove_dir_all(self.root.join(scratch_key));
        Ok(())
    }
}
