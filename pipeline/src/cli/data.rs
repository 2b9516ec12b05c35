//! Data preparation: `tiderec convert` (raw records to featurized Parquet),
//! `generate` (elm-shaped datasets) and `spec` (feature-spec presets).

use anyhow::Context;
use clap::{Args, Subcommand};
use std::path::PathBuf;
use tiderec::paths::{self, Named};
use tiderec::settings::range::{self, Range};
use tiderec::settings::ConvertFlags;

#[derive(Subcommand)]
pub(crate) enum SpecCommand {
    /// The preset names (use as `--spec preset:NAME`).
    List,
    /// Print a preset as TOML (`tiderec spec show criteo > my.toml`, edit, `--spec my.toml`).
    Show(SpecShowArgs),
    /// Parse and validate a spec (preset or TOML file), vocabularies included.
    Check(SpecShowArgs),
}

#[derive(Args)]
pub(crate) struct SpecShowArgs {
    /// `criteo`, `avazu`, `elm`, `elm_y_long`, `elm_dien`, `taobao_ad` (or `preset:NAME`), or a TOML file for `check`.
    name: String,
    /// Rows per table where the spec gives none (as `train --buckets`).
    #[arg(long, value_name = "N", default_value_t = tiderec::settings::DEFAULT_BUCKETS, value_parser = Range::<u64>::closed("buckets", 1, range::MAX_ROWS))]
    buckets: u64,
    /// Most items kept of a list where the spec gives none (as `train --max-len`; elm keeps 50,
    /// elm_y_long 400).
    #[arg(long, value_name = "N", default_value_t = tiderec::settings::DEFAULT_MAX_LEN, value_parser = Range::<usize>::closed("max_len", 1, 1 << 20))]
    max_len: usize,
    /// `check` only: `csv:PATH[,PATH…]` records to learn the spec's scales and quantiles from,
    /// and to warn about dense columns whose range makes training unstable.
    #[arg(long, value_name = "csv:PATH,…")]
    data: Option<String>,
}

#[derive(Subcommand)]
pub(crate) enum GenerateCommand {
    /// Ele.me-shaped CSV lines (39 columns, `;` lists; labels carry no signal). Train with `--data csv:FILE --spec elm`.
    Elm(ElmArgs),
}

#[derive(Args)]
pub(crate) struct ElmArgs {
    /// Output file.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Replace --out when it exists (refused otherwise).
    #[arg(long)]
    overwrite: bool,
    /// Number of lines.
    #[arg(long, value_name = "N", default_value_t = 100_000, value_parser = Range::<u64>::closed("rows", 1, range::MAX_STEPS))]
    rows: u64,
    /// List length scale: 1 = elm, 8 = elm_y_long.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = Range::<usize>::closed("list_scale", 1, tiderec_sources::elm::MAX_LIST_SCALE))]
    list_scale: usize,
    /// Seed.
    #[arg(long, value_name = "SEED", default_value_t = 42)]
    seed: u64,
}

/// Flags of `tiderec convert`; the feature flags mean what they mean for `tiderec train`.
#[derive(Args)]
#[command(mut_arg("dead_letters", |a| a.help(CONVERT_DEAD_LETTERS_HELP)))]
pub(crate) struct ConvertArgs {
    /// Input: `criteo:PATH[,PATH…]`, `avazu:PATH[,PATH…]` or `csv:PATH[,PATH…]` with --spec (files or directories).
    #[arg(long, value_name = "FORMAT:PATH,…")]
    from: String,
    /// Output: `parquet:DIR` (created; must not hold *.parquet files yet).
    #[arg(long, value_name = "parquet:DIR")]
    to: String,
    /// Rows per row group (the unit of reading, and of the per-epoch order of files from other writers).
    #[arg(long, value_name = "N", default_value_t = tiderec_sources::parquet::DEFAULT_ROW_GROUP_ROWS, value_parser = Range::<usize>::closed("row_group_rows", 1, 1 << 30))]
    row_group_rows: usize,
    /// Start a new file after this many rows (default: one file).
    #[arg(long, value_name = "N", value_parser = Range::<u64>::closed("rows_per_file", 1, range::MAX_STEPS))]
    rows_per_file: Option<u64>,
    /// zstd compression level (1-22).
    #[arg(long, value_name = "LEVEL", default_value_t = 3, value_parser = Range::<i32>::closed("zstd_level", 1, 22))]
    zstd_level: i32,
    /// The featurizing settings, as for `train` (a `--config` file's other settings are ignored).
    #[command(flatten)]
    settings: ConvertFlags,
}

const CONVERT_DEAD_LETTERS_HELP: &str =
    "Dead-letter file for malformed records [default: beside the output directory, DIR.dead-letters.tsv]";

impl ConvertArgs {
    fn into_settings(self) -> anyhow::Result<tiderec::convert::ConvertSettings> {
        let args = self;
        let mut s = args.settings.settings()?;
        s.data.source = args.from;
        let out = tiderec::convert::parse_target("to", &args.to)?;
        // Unless told, beside the output: never the file a training run in the same directory writes.
        let default_dead = tiderec::settings::RecordPolicy::default().dead_letters;
        if !args.settings.given("dead_letters") && s.data.records.dead_letters == default_dead {
            // Named by the directory itself, also when given as `.` or `dir/..`.
            let named = if out.file_name().is_some() { out.clone() } else { out.canonicalize().unwrap_or(out.clone()) };
            s.data.records.dead_letters = tiderec::predict::dead_letters_beside(&named);
        }
        let mut inputs: Vec<Named> =
            args.settings.config_path().map(|c| Named::new("--config", c)).into_iter().collect();
        inputs.extend(paths::data_files("--from", &s.data.source)?);
        inputs.extend(s.data.spec.as_deref().map(paths::spec_files).unwrap_or_default());
        let outputs = [Named::new("--to", &out), Named::new("--dead-letters", &s.data.records.dead_letters)];
        paths::check_outputs(&inputs, &outputs)?;
        // Nothing is written into a directory read as data: not the Parquet files (nor the
        // lock beside them), not the dead letters.
        let written = [Named::new("--to", out.join(tiderec::dir_lock::LOCK_FILE)), outputs[1].clone()];
        paths::check_outside(&paths::data_dirs("--from", &s.data.source), &written)?;
        let writer = tiderec_sources::parquet::WriterOptions {
            row_group_rows: args.row_group_rows,
            rows_per_file: args.rows_per_file,
            zstd_level: args.zstd_level,
        };
        Ok(tiderec::convert::ConvertSettings { input: s, out, writer })
    }
}

/// `tiderec spec list`: prints the preset names.
pub(crate) fn run_spec_list() {
    for name in tiderec_operators::spec::FeatureSpec::PRESETS {
        println!("{name}");
    }
}

/// `tiderec spec show`: prints a preset as TOML.
pub(crate) fn run_spec_show(a: SpecShowArgs) -> anyhow::Result<()> {
    let name = a.name.strip_prefix("preset:").unwrap_or(&a.name);
    let spec = tiderec_operators::spec::FeatureSpec::preset(name, a.buckets, a.max_len).with_context(|| {
        format!("no preset `{name}`; presets: {}", tiderec_operators::spec::FeatureSpec::PRESETS.join(", "))
    })?;
    println!("# tiderec feature spec: preset `{name}` (edit, then pass with --spec FILE.toml)");
    print!("{}", spec.to_toml());
    Ok(())
}

/// `tiderec spec check`: validates a spec, and learns its ranges from `--data` records.
pub(crate) fn run_spec_check(a: SpecShowArgs) -> anyhow::Result<()> {
    let mut spec = tiderec::config::resolve_spec(&a.name, a.buckets, a.max_len)?;
    if let Some(data) = &a.data {
        let paths = match tiderec::config::DataSpec::parse("data", data)? {
            tiderec::config::DataSpec::Csv(paths) => paths,
            _ => anyhow::bail!("--data: `spec check` reads `csv:PATH[,PATH…]` files"),
        };
        let max_line = tiderec::settings::RecordPolicy::default().max_line_bytes;
        let (learned, warnings) = tiderec::spec_fit::check_ranges(&mut spec, &paths, max_line)?;
        for line in learned.into_iter().chain(warnings.iter().map(|w| format!("warning: {w}"))) {
            eprintln!("{line}");
        }
    }
    let (d, s) = spec.shape();
    println!(
        "ok: {} columns, {d} dense, {s} sparse fields, {} sequence lists",
        spec.columns.len(),
        spec.sequence_lists().count()
    );
    Ok(())
}

/// `tiderec generate elm`: writes elm-shaped CSV lines.
pub(crate) fn run_generate_elm(a: ElmArgs) -> anyhow::Result<()> {
    use std::io::Write;
    paths::check_new(&Named::new("--out", &a.out), a.overwrite)?;
    // Written whole beside it, then renamed over it: a full disk or an interrupt leaves
    // the file given (or its absence) as it was, never a shorter file that looks valid.
    let tmp = tiderec_sinks::temp::temp_beside(&a.out);
    let written = (|| -> anyhow::Result<()> {
        let file = std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        let mut w = std::io::BufWriter::new(file);
        let mut line = Vec::new();
        for i in 0..a.rows {
            line.clear();
            tiderec_sources::elm::elm_line(a.seed, i, a.list_scale, &mut line);
            line.push(b'\n');
            w.write_all(&line).with_context(|| format!("cannot write {}", tmp.display()))?;
        }
        let file =
            w.into_inner().map_err(|e| e.into_error()).with_context(|| format!("cannot write {}", tmp.display()))?;
        file.sync_all().with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &a.out).with_context(|| format!("cannot rename {} to {}", tmp.display(), a.out.display()))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    eprintln!("wrote {} elm-shaped lines (list scale {}) to {}", a.rows, a.list_scale, a.out.display());
    Ok(())
}

/// `tiderec convert`: converts record files to Parquet and prints the summary.
pub(crate) fn run_convert(a: ConvertArgs) -> anyhow::Result<()> {
    let settings = a.into_settings()?;
    eprintln!("tiderec convert: {} -> parquet:{}", settings.input.data.source, settings.out.display());
    let s = tiderec::convert::convert(&settings).context("conversion failed")?;
    if s.interrupted {
        eprintln!(
            "interrupted by a signal: {} holds the first {} samples in complete files; convert again \
             into an empty directory for all of them",
            s.out, s.rows
        );
    }
    println!(
        "converted {} rows into {} file(s), {} row group(s) in {} ({:.1} s, {:.0} rows/s)",
        s.rows,
        s.files,
        s.row_groups,
        s.out,
        s.seconds,
        s.rows as f64 / s.seconds.max(1e-9)
    );
    println!("  {} -> {} bytes ({:.2}x)", s.bytes_in, s.bytes_out, s.bytes_in as f64 / s.bytes_out.max(1) as f64);
    println!("  bad records     {} {:?}", s.bad_records, s.bad_records_by_reason);
    if s.bad_records > 0 {
        eprintln!(
            "{} malformed records skipped; see {}",
            s.bad_records,
            settings.input.data.records.dead_letters.display()
        );
    }
    Ok(())
}
