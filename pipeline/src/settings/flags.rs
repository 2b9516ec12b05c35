//! Settings given as command-line flags: every one for `train` and `online`, a subset for `convert`.

use super::TrainSettings;
use crate::PipelineError;
use clap::parser::ValueSource;
use clap::{Arg, ArgMatches, Args, Command, FromArgMatches};
use std::marker::PhantomData;
use std::path::PathBuf;

/// Which settings a command takes as flags.
pub trait Subset {
    /// The keys of the settings offered, or `None` for all of them.
    const KEYS: Option<&'static [&'static str]>;
    /// The command, for messages.
    const COMMAND: &'static str;
}

/// Every setting: `train` and `online`.
#[derive(Clone, Copy, Debug)]
pub struct All;

impl Subset for All {
    const KEYS: Option<&'static [&'static str]> = None;
    const COMMAND: &'static str = "train";
}

/// The settings that decide how records become features: `convert`.
#[derive(Clone, Copy, Debug)]
pub struct Featurizing;

impl Subset for Featurizing {
    const KEYS: Option<&'static [&'static str]> = Some(&[
        "spec",
        "seed",
        "hash_seed",
        "buckets",
        "table_sizes",
        "max_len",
        "on_bad_record",
        "dead_letters",
        "max_bad_fraction",
        "max_line_bytes",
        "progress",
    ]);
    const COMMAND: &'static str = "convert";
}

/// The flags of a subset of the [`TrainSettings`] settings plus `--config FILE`, as given on a
/// command line.
///
/// Parsing keeps the matches; [`Flags::settings`] applies them over the file (or the
/// defaults): one generic merge for every setting, since clap's derived update touches
/// exactly the settings whose flags were given.
#[derive(Clone, Debug)]
pub struct Flags<S: Subset> {
    matches: ArgMatches,
    subset: PhantomData<S>,
}

/// The flags of `train` and `online`: every setting.
pub type TrainFlags = Flags<All>;

/// The flags of `convert`: the featurizing settings.
pub type ConvertFlags = Flags<Featurizing>;

impl<S: Subset> Flags<S> {
    /// Parses `args` (without a program name); for tests and programs that embed the CLI.
    pub fn parse_from<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let cmd = Self::augment_args(Command::new("settings").no_binary_name(true));
        Ok(Flags { matches: cmd.try_get_matches_from(args)?, subset: PhantomData })
    }

    /// True when setting `key`'s flag was given on the command line.
    pub fn given(&self, key: &str) -> bool {
        self.matches.value_source(key) == Some(ValueSource::CommandLine)
    }

    /// The `--config` file, when one was given.
    pub fn config_path(&self) -> Option<&std::path::Path> {
        self.matches.get_one::<PathBuf>("config").map(PathBuf::as_path)
    }

    /// The settings: defaults, then the `--config` file, then the flags given.
    ///
    /// A flag outside the command's subset is refused, naming it.
    pub fn settings(&self) -> Result<TrainSettings, PipelineError> {
        if let Some(keys) = S::KEYS {
            let all = TrainSettings::keys();
            let refused: Vec<String> = self
                .matches
                .ids()
                .map(|id| id.as_str())
                .filter(|id| all.iter().any(|k| k == id) && !keys.contains(id))
                .filter(|id| self.matches.value_source(id) == Some(ValueSource::CommandLine))
                .map(|id| format!("--{}", id.replace('_', "-")))
                .collect();
            if !refused.is_empty() {
                return Err(PipelineError::config(
                    "flags",
                    format!(
                        "{} not apply to `{}`, which reads the settings {}",
                        refused.join(", ") + if refused.len() == 1 { " does" } else { " do" },
                        S::COMMAND,
                        keys.join(", ")
                    ),
                ));
            }
        }
        let mut settings = match self.matches.get_one::<PathBuf>("config") {
            Some(path) => TrainSettings::from_toml_file(path)?,
            None => TrainSettings::default(),
        };
        settings.update_from_arg_matches(&self.matches).map_err(|e| PipelineError::config("flags", e.to_string()))?;
        Ok(settings)
    }
}

impl<S: Subset> Args for Flags<S> {
    fn augment_args(cmd: Command) -> Command {
        let config = Arg::new("config")
            .long("config")
            .value_name("FILE")
            .value_parser(clap::value_parser!(PathBuf))
            .help("TOML file with any of the settings below (flags override it)");
        let cmd = cmd.arg(config);
        match S::KEYS {
            None => TrainSettings::augment_args(cmd),
            // Every setting is known, so that the derived update can look each one up; those
            // outside the subset are hidden from `--help` and refused by `settings`.
            // The command's own flags, declared before this group, stay shown.
            Some(keys) => {
                let all = TrainSettings::keys();
                TrainSettings::augment_args(cmd).mut_args(|a| {
                    let id = a.get_id().as_str();
                    if all.iter().any(|k| k == id) && !keys.contains(&id) {
                        a.hide(true)
                    } else {
                        a
                    }
                })
            }
        }
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl<S: Subset> FromArgMatches for Flags<S> {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        Ok(Flags { matches: matches.clone(), subset: PhantomData })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        self.matches = matches.clone();
        Ok(())
    }
}

/// A group of settings taken as flags by a command that has no `--config` file: the
/// group's [`Default`] with the flags given applied over it, so the defaults stay declared
/// once, in the group's `Default` (its flags carry no clap defaults).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OverDefaults<T>(pub T);

impl<T: Args + Default> Args for OverDefaults<T> {
    fn augment_args(cmd: Command) -> Command {
        T::augment_args(cmd)
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        T::augment_args_for_update(cmd)
    }
}

impl<T: FromArgMatches + Default> FromArgMatches for OverDefaults<T> {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut value = T::default();
        value.update_from_arg_matches(matches)?;
        Ok(OverDefaults(value))
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(matches)
    }
}
