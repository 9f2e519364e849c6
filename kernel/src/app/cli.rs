//! The `opkernel` command line: `serve` (its flags are the settings
//! table's rows that have one), `settings`, `drill`, and the client verbs
//! of [`crate::surfaces::cli`].

use std::collections::BTreeMap;

use clap::{Arg, ArgAction, ArgMatches, Args, FromArgMatches, Parser, Subcommand};

use super::settings::table::{self as t, ALL};
use super::settings::{Kind, Reader};
use crate::surfaces::cli::client::Client;

/// The parsed command line: one verb and its arguments.
#[derive(Debug, Parser)]
#[command(
    name = "opkernel",
    version,
    about = "Container sandbox operation kernel for AI agents"
)]
pub struct Cli {
    /// The verb to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Every verb of the `opkernel` binary.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the kernel daemon
    Serve(ServeFlags),
    /// Print every setting: its variable, kind, default and what it does
    Settings {
        /// Print the Markdown table of docs/settings.md
        #[arg(long)]
        markdown: bool,
    },
    /// Run recovery drills against the local Docker engine
    Drill {
        /// Drill to run, or all
        #[arg(default_value = "all")]
        name: String,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// A client verb (talks to the daemon over HTTP).
    #[command(flatten)]
    Client(crate::surfaces::cli::Command),
}

/// The `serve` flags given, by their setting's variable name; a flag
/// overrides its variable (clap reads the variable too, for `--help`).
#[derive(Debug, Clone, Default)]
pub struct ServeFlags(pub BTreeMap<&'static str, String>);

impl FromArgMatches for ServeFlags {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut given = BTreeMap::new();
        for s in ALL.iter().filter(|s| s.flag.is_some()) {
            if s.kind == Kind::Switch {
                if m.get_flag(s.env) {
                    given.insert(s.env, "on".to_owned());
                }
            } else if let Some(v) = m.get_one::<String>(s.env) {
                given.insert(s.env, v.clone());
            }
        }
        Ok(ServeFlags(given))
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = ServeFlags::from_arg_matches(m)?;
        Ok(())
    }
}

impl Args for ServeFlags {
    fn augment_args(mut cmd: clap::Command) -> clap::Command {
        for s in ALL {
            let Some(flag) = s.flag else { continue };
            let mut arg = Arg::new(s.env).long(flag).help(s.doc_line());
            arg = match s.kind {
                // switches are read by the settings' reader (on/off/1/0…)
                Kind::Switch => arg.action(ArgAction::SetTrue),
                _ => arg.env(s.env).value_name(s.kind.value_name()),
            };
            if s.scope == super::settings::Scope::Drills {
                arg = arg.hide(true);
            }
            cmd = cmd.arg(arg);
        }
        cmd
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        ServeFlags::augment_args(cmd)
    }
}

/// The client of a verb: the daemon at `OPKERNEL_URL` with
/// `OPKERNEL_TOKEN`, else the home's operator token; an `https://` daemon
/// checked against the system's roots and `OPKERNEL_CA`.
pub fn client() -> anyhow::Result<Client> {
    let env = |name: &str| std::env::var(name).ok();
    let mut r = Reader::new(&env, BTreeMap::new());
    let url = r.text(&t::URL).unwrap_or_default();
    let token = r.text(&t::TOKEN);
    let home = super::settings::load::home(&mut r);
    let ca = super::settings::load::ca_file(&mut r, &t::CA);
    if let Some(bad) = r.invalid.first() {
        anyhow::bail!("invalid setting: {bad}");
    }
    if let Some(ca) = ca {
        crate::base::tls::trust(&ca)?;
    }
    Client::connect(url, token, &home)
}

/// Runs the verb `cli` names; returns the process's exit status.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Serve(flags) => super::serve::run(flags.0).await,
        Command::Settings { markdown } => {
            let docs = super::settings::docs::markdown();
            print!(
                "{}",
                if markdown {
                    docs
                } else {
                    super::settings::docs::listing()
                }
            );
            Ok(0)
        }
        Command::Drill { name, json } => crate::drills::run_cli(&name, json).await,
        Command::Client(verb) => crate::surfaces::cli::run_client(client()?, verb).await,
    }
}
