//! Every `--flag` that a message in the source names is a real flag of
//! the `captune` binary: an error that tells a user to pass `--ids` when
//! the flag is `--features-ids` fails here.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Flags of other programs that captune's messages may name.
const OTHER_PROGRAMS: [&str; 2] = ["--release", "--path"];

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_captune"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?} --help");
    String::from_utf8(out.stdout).unwrap()
}

/// The long flags of the command `path` and of all its subcommands.
fn flags_of(path: &mut Vec<String>, flags: &mut BTreeSet<String>) {
    let args: Vec<&str> = path.iter().map(String::as_str).collect();
    let text = help(&args);
    let mut in_commands = false;
    let mut subcommands = Vec::new();
    for line in text.lines() {
        if line.ends_with(':') && !line.starts_with(' ') {
            in_commands = line == "Commands:";
            continue;
        }
        let word = line.trim_start();
        if in_commands {
            if let Some(name) = word.split_whitespace().next()
                && name != "help"
            {
                subcommands.push(name.to_string());
            }
            continue;
        }
        for token in word.split([' ', ',']) {
            if let Some(flag) = token.strip_prefix("--") {
                let flag = flag.split(['=', '<']).next().unwrap();
                flags.insert(format!("--{flag}"));
            }
        }
    }
    for sub in subcommands {
        path.push(sub);
        flags_of(path, flags);
        path.pop();
    }
}

/// The contents of the string literals in `source`.
fn literals(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = source.chars().peekable();
    let mut previous = ' ';
    while let Some(c) = chars.next() {
        // A quote inside a char literal ('"') opens nothing.
        if c == '"' && previous != '\'' {
            let mut text = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => {
                        chars.next();
                    }
                    '"' => break,
                    _ => text.push(c),
                }
            }
            out.push(text);
        }
        previous = c;
    }
    out
}

fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push((
                path.display().to_string(),
                std::fs::read_to_string(&path).unwrap(),
            ));
        }
    }
}

#[test]
fn every_flag_a_message_names_exists() {
    let mut flags = BTreeSet::new();
    flags_of(&mut Vec::new(), &mut flags);
    assert!(
        flags.contains("--features-ids") && flags.contains("--overwrite"),
        "{flags:?}"
    );
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let mut named = 0;
    let mut unknown = Vec::new();
    for (file, source) in &files {
        for literal in literals(source) {
            for (i, _) in literal.match_indices("--") {
                let flag: String = literal[i + 2..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
                    .collect();
                if flag.is_empty() || !flag.starts_with(|c: char| c.is_ascii_lowercase()) {
                    continue;
                }
                let flag = format!("--{}", flag.trim_end_matches('-'));
                named += 1;
                if !flags.contains(&flag) && !OTHER_PROGRAMS.contains(&flag.as_str()) {
                    unknown.push(format!("{file}: {flag} in {literal:?}"));
                }
            }
        }
    }
    assert!(named > 20, "the scan found only {named} flags in messages");
    assert!(
        unknown.is_empty(),
        "messages name flags that do not exist:\n{}",
        unknown.join("\n")
    );
}
