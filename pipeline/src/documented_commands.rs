//! Every `tiderec` command the README and `docs/` show in a shell block
//! parses on this command line: a renamed or removed flag, a subcommand that
//! moved or a value its parser refuses fails here, not in a reader's terminal.
//!
//! A command is a line (joined over `\` continuations) of a fenced `sh`,
//! `bash` or `shell` block that starts with `tiderec` or
//! `cargo run --release --`, after any `VAR=value` assignments; `&&` starts
//! another, a trailing `&` and a `#` comment are not part of it, and
//! `[--flag value]` marks optional words, which are parsed too. A command
//! with `...` stands for "the settings above" and is left out.
//!
//! Inline code spans in prose (`` `tiderec bench kernels --rows R` ``) name
//! subcommands and flags with placeholders for values, so of them only the
//! names are checked: an unknown subcommand or flag fails, a placeholder value
//! or a required flag left out does not. Spans with alternatives (`|`), an
//! ellipsis (`…`) or a redirection stop where those begin.

use super::Cli;
use clap::Parser;
use std::path::{Path, PathBuf};

/// One documented command: where it stands and its words after the program.
struct Documented {
    at: String,
    args: Vec<String>,
    /// A whole command from a shell block; else an inline span, of which
    /// only the names are checked.
    whole: bool,
}

/// The repository's root.
pub(super) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The README and every Markdown file of `docs/`.
pub(super) fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ is readable")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.sort();
    files.insert(0, root.join("README.md"));
    files
}

/// Each line of `text` that is not a fence, with its number and the info
/// string of the fenced block it stands in (`None` in prose).
fn lines_in_blocks(text: &str) -> Vec<(usize, &str, Option<&str>)> {
    let mut block = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        match line.trim_start().strip_prefix("```") {
            Some(info) => block = if block.is_none() { Some(info.trim()) } else { None },
            None => out.push((i + 1, line, block)),
        }
    }
    out
}

/// The shell lines of `text`'s fenced `sh`/`bash`/`shell` blocks, continuations
/// joined, each with its first line's number.
fn shell_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    // A line ending in `\`: where it started and the words so far.
    let mut pending: Option<(usize, String)> = None;
    for (number, line, block) in lines_in_blocks(text) {
        if !matches!(block, Some("sh" | "bash" | "shell")) {
            continue;
        }
        let (start, mut joined) = pending.take().unwrap_or((number, String::new()));
        match line.trim_end().strip_suffix('\\') {
            Some(head) => {
                joined.push_str(head);
                joined.push(' ');
                pending = Some((start, joined));
            }
            None => {
                joined.push_str(line);
                out.push((start, joined));
            }
        }
    }
    out
}

/// The `tiderec` commands of one shell line (`&&` separates them).
fn commands(line: &str) -> Vec<Vec<String>> {
    // A quote that spans lines (a JSON body after `curl -d`) leaves its lines
    // unsplittable; none of them may be a `tiderec` command.
    let Some(words) = shlex::split(line) else {
        assert!(!line.contains("tiderec "), "unbalanced quotes in the command {line:?}");
        return Vec::new();
    };
    let words: Vec<String> = words.into_iter().take_while(|w| !w.starts_with('#')).collect();
    let mut found = Vec::new();
    for part in words.split(|w| w == "&&" || w == ";") {
        let mut part: Vec<&str> = part.iter().map(String::as_str).skip_while(|w| is_assignment(w)).collect();
        if part.last() == Some(&"&") {
            part.pop();
        }
        let args = match part.as_slice() {
            ["tiderec", rest @ ..] => rest,
            ["cargo", "run", "--release", "--", rest @ ..] => rest,
            _ => continue,
        };
        if args.contains(&"...") {
            continue;
        }
        found.push(args.iter().map(|w| unbracket(w)).collect());
    }
    found
}

/// `NAME=value`, as a command's environment is set before it.
fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    })
}

/// The `tiderec …` inline code spans of `text`'s prose, each with its line's
/// number, cut where an alternative, an ellipsis or a redirection begins.
fn inline_spans(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    for (number, line, _) in lines_in_blocks(text).into_iter().filter(|(_, _, block)| block.is_none()) {
        // Between the backticks of `a`b`c`: the odd-numbered pieces are code.
        for code in line.split('`').skip(1).step_by(2) {
            let Some(rest) = code.strip_prefix("tiderec ") else { continue };
            let words = rest
                .split_whitespace()
                .take_while(|w| !w.contains('|') && !w.contains('…') && !w.starts_with('>'))
                .map(unbracket)
                .collect();
            out.push((number, words));
        }
    }
    out
}

/// A word of `[--flag value]`, the brackets that mark it optional taken off.
fn unbracket(word: &str) -> String {
    word.trim_start_matches('[').trim_end_matches(']').to_string()
}

fn documented() -> Vec<Documented> {
    let mut all = Vec::new();
    for file in documents() {
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        for (line, shell) in shell_lines(&text) {
            for args in commands(&shell) {
                all.push(Documented { at: format!("{name}:{line}"), args, whole: true });
            }
        }
        for (line, args) in inline_spans(&text) {
            all.push(Documented { at: format!("{name}:{line}"), args, whole: false });
        }
    }
    all
}

/// Why `d` is not a command of this command line, if it is not.
fn refused(d: &Documented) -> Option<clap::Error> {
    use clap::error::ErrorKind;
    let argv = std::iter::once("tiderec").chain(d.args.iter().map(String::as_str));
    let e = Cli::try_parse_from(argv).err()?;
    let names = matches!(e.kind(), ErrorKind::UnknownArgument | ErrorKind::InvalidSubcommand);
    // A subcommand's name alone prints its help rather than running.
    let help = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand);
    (d.whole && !help || names).then_some(e)
}

#[test]
fn every_documented_command_parses() {
    let all = documented();
    // The README's first line and the docs' tours: an extractor that finds
    // nothing would pass every command.
    assert!(all.iter().filter(|d| d.whole).count() >= 50, "only {} documented commands found", all.len());
    assert_eq!(all[0].args, ["train"], "the README's first command is `cargo run --release -- train`");
    assert!(all.iter().filter(|d| !d.whole).count() >= 50, "the inline spans were not found");
    let failures: Vec<String> =
        all.iter().filter_map(|d| refused(d).map(|e| format!("{}: tiderec {}\n{e}", d.at, d.args.join(" ")))).collect();
    assert!(failures.is_empty(), "documented commands that do not parse:\n\n{}", failures.join("\n"));
}

#[test]
fn commands_are_found_as_a_reader_types_them() {
    let text = "```sh\nTIDEREC_MAX_ISA=avx2 tiderec train --workers 2 \\\n    --epochs 3   # two\n```\n\
                ```text\ntiderec not-a-command\n```\n\
                ```bash\ntiderec convert --from a --to b && tiderec train --data parquet:b [--json] &\n\
                tiderec online ... --resume\necho tiderec\n```\n";
    let found: Vec<(usize, Vec<Vec<String>>)> = shell_lines(text).iter().map(|(n, l)| (*n, commands(l))).collect();
    let words = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
    assert_eq!(
        found,
        vec![
            (2, vec![words("train --workers 2 --epochs 3")]),
            (9, vec![words("convert --from a --to b"), words("train --data parquet:b --json")]),
            (10, vec![]),
            (11, vec![]),
        ]
    );
    // A flag the command line does not know is refused, so the test above can fail.
    assert!(Cli::try_parse_from(["tiderec", "train", "--no-such-flag"]).is_err());
}

#[test]
fn inline_spans_are_checked_by_their_names() {
    let text = "Run `tiderec bench kernels --rows R` or `tiderec bench dlrm|model`, then `tiderec predict`.\n\
                ```sh\n`tiderec not-prose`\n```\nAlso `tiderec spec show criteo > my.toml` and `tiderec trian`.\n";
    let spans = inline_spans(text);
    let words = |s: &str| s.split(' ').filter(|w| !w.is_empty()).map(str::to_string).collect::<Vec<_>>();
    let want = [(1, "bench kernels --rows R"), (1, "bench"), (1, "predict"), (5, "spec show criteo"), (5, "trian")];
    assert_eq!(spans, want.map(|(n, s)| (n, words(s))));
    let check = |args: &str, whole: bool| refused(&Documented { at: String::new(), args: words(args), whole });
    // A placeholder value and a required flag left out pass in prose, not in a shell block.
    assert!(check("bench kernels --rows R", false).is_none());
    assert!(check("predict", false).is_none());
    assert!(check("bench kernels --rows R", true).is_some());
    assert!(check("predict", true).is_some());
    // An unknown subcommand or flag fails either way.
    assert!(check("trian", false).is_some());
    assert!(check("bench kernels --rowz 8", false).is_some());
}
