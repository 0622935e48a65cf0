//! `archon memory ls|search|show|forget|export|import`: the long-term memory agents with `memory: true`
//! keep in the state directory (or, with `--store`, in the PostgreSQL run store's database), read and
//! changed by a person.

use std::collections::HashSet;
use std::io::BufRead;
use std::path::PathBuf;

use anyhow::Context as _;
use archon_engine::run::memory::{Kind, Memory, MemoryStore, Recall};

use super::Status;
use super::runs::{table, timestamp};
use crate::args::{
    MemoryExportArgs, MemoryFileArgs, MemoryForgetArgs, MemoryImportArgs, MemoryLsArgs,
    MemorySearchArgs, MemoryShowArgs,
};
use crate::output;

/// Most characters of a memory's text in a table.
const TEXT_CHARS: usize = 72;
/// Largest line `import` reads.
const MAX_LINE_BYTES: usize = 1 << 20;

fn path(args: &MemoryFileArgs) -> PathBuf {
    args.state.dir().join(&args.file)
}

/// How messages name the memory: the file, or the file's key in the run store's database.
fn shown(args: &MemoryFileArgs) -> String {
    let at = args.state.at();
    if at.url.is_some() {
        format!("{}` in `{}", args.file.display(), at.shown())
    } else {
        path(args).display().to_string()
    }
}

/// The memory of the file `--file` names: in the state directory, or in the PostgreSQL run store
/// `--store` names (`None` when there is none yet, unless `create`).
fn store(args: &MemoryFileArgs, create: bool) -> anyhow::Result<Option<MemoryStore>> {
    let at = args.state.at();
    if at.url.is_none() {
        let path = path(args);
        if !create && !path.exists() {
            return Ok(None);
        }
        return Ok(Some(MemoryStore::open(&path)?));
    }
    let file = args.file.to_string_lossy();
    Ok(archon_engine::session::stored_memory(&at, &file, create)?)
}

/// The memory, when there is any; a note saying there is none otherwise.
fn existing(args: &MemoryFileArgs) -> anyhow::Result<Option<MemoryStore>> {
    let found = store(args, false)?;
    if found.is_none() {
        if args.json {
            output::stdout("[]\n");
        } else {
            output::stdout(&format!("no memory in `{}`\n", shown(args)));
        }
    }
    Ok(found)
}

pub fn ls(args: &MemoryLsArgs) -> anyhow::Result<Status> {
    let Some(store) = existing(&args.memory)? else {
        return Ok(Status::Success);
    };
    let Some(namespace) = &args.namespace else {
        let namespaces = store.namespaces()?;
        if args.memory.json {
            output::stdout_json(&namespaces);
        } else {
            let rows: Vec<[String; 3]> = namespaces
                .iter()
                .map(|n| [n.name.clone(), n.live.to_string(), n.total.to_string()])
                .collect();
            output::stdout(&output::printable(&table(
                &["NAMESPACE", "LIVE", "TOTAL"],
                &rows,
            )));
        }
        return Ok(Status::Success);
    };
    let memories: Vec<Memory> = store
        .list(Some(namespace), args.all)?
        .into_iter()
        .filter(|m| args.all || m.kind == Kind::Fact)
        .collect();
    print_list(&memories, args.memory.json, args.all);
    Ok(Status::Success)
}

pub fn search(args: &MemorySearchArgs) -> anyhow::Result<Status> {
    let Some(store) = existing(&args.memory)? else {
        return Ok(Status::Success);
    };
    let kinds = if args.episodes {
        [Kind::Episode]
    } else {
        [Kind::Fact]
    };
    let found = store.recall(&Recall {
        namespace: &args.namespace,
        kinds: &kinds,
        query: &args.query,
        limit: args.limit.max(1),
        exclude: &HashSet::new(),
        superseded: false,
        embedding: None,
    })?;
    print_list(&found, args.memory.json, false);
    Ok(Status::Success)
}

pub fn show(args: &MemoryShowArgs) -> anyhow::Result<Status> {
    let Some(memory) = store(&args.memory, false)?
        .map(|store| store.get(args.id))
        .transpose()?
        .flatten()
    else {
        output::stderr(&format!("error: no memory `{}`\n", args.id));
        return Ok(Status::Failure);
    };
    if args.memory.json {
        output::stdout_json(&memory);
        return Ok(Status::Success);
    }
    let mut text = format!(
        "memory {} · {} · namespace `{}`\n",
        memory.id,
        memory.kind.as_str(),
        memory.namespace
    );
    text.push_str(&format!(
        "created {}",
        timestamp(u64::try_from(memory.created_ms).unwrap_or(0))
    ));
    if let Some(run) = &memory.run {
        text.push_str(&format!(" by run {run}"));
    }
    if let Some(step) = &memory.step {
        text.push_str(&format!(", step `{step}`"));
    }
    text.push('\n');
    if let Some(old) = memory.supersedes {
        text.push_str(&format!("replaces memory {old}\n"));
    }
    if let Some(by) = memory.superseded_by {
        text.push_str(&format!("replaced by memory {by}\n"));
    }
    if let Some(when) = memory.forgotten_ms {
        text.push_str(&format!(
            "forgotten {}{}\n",
            timestamp(u64::try_from(when).unwrap_or(0)),
            memory
                .forgotten_reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ));
    }
    text.push('\n');
    text.push_str(&memory.content);
    text.push('\n');
    output::stdout(&output::printable(&text));
    Ok(Status::Success)
}

pub fn forget(args: &MemoryForgetArgs) -> anyhow::Result<Status> {
    let Some(store) = store(&args.memory, false)? else {
        output::stderr(&format!("error: no memory `{}`\n", args.id));
        return Ok(Status::Failure);
    };
    match store.forget(None, args.id, args.reason.as_deref()) {
        Ok(memory) => {
            if args.memory.json {
                output::stdout_json(&memory);
            } else {
                output::stdout(&format!("forgot memory {}\n", memory.id));
            }
            Ok(Status::Success)
        }
        Err(e) => {
            output::stderr(&format!("error: {e}\n"));
            Ok(Status::Failure)
        }
    }
}

pub fn export(args: &MemoryExportArgs) -> anyhow::Result<Status> {
    let Some(store) = store(&args.memory, false)? else {
        return Ok(Status::Success);
    };
    let mut text = String::new();
    for memory in store.list(args.namespace.as_deref(), true)? {
        text.push_str(&serde_json::to_string(&memory)?);
        text.push('\n');
    }
    output::stdout(&text);
    Ok(Status::Success)
}

pub fn import(args: &MemoryImportArgs) -> anyhow::Result<Status> {
    let reader: Box<dyn BufRead> = if args.input.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        let file = std::fs::File::open(&args.input)
            .with_context(|| format!("cannot read `{}`", args.input.display()))?;
        if !file.metadata()?.is_file() {
            anyhow::bail!("`{}` is not a regular file", args.input.display());
        }
        Box::new(std::io::BufReader::new(file))
    };
    let mut records = Vec::new();
    for (number, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("line {}", number + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        if line.len() > MAX_LINE_BYTES {
            anyhow::bail!(
                "line {} of `{}` is longer than {} KiB",
                number + 1,
                args.input.display(),
                MAX_LINE_BYTES / 1024
            );
        }
        let record: Memory = serde_json::from_str(&line).with_context(|| {
            format!(
                "line {} of `{}` is not a memory `archon memory export` wrote",
                number + 1,
                args.input.display()
            )
        })?;
        records.push(record);
    }
    let Some(store) = store(&args.memory, true)? else {
        anyhow::bail!("no memory store at `{}`", shown(&args.memory));
    };
    let (new, known) = store.import(&records, args.namespace.as_deref())?;
    if args.memory.json {
        output::stdout_json(&serde_json::json!({ "imported": new, "already_known": known }));
    } else {
        output::stdout(&format!(
            "imported {new} memories ({known} already known)\n"
        ));
    }
    Ok(Status::Success)
}

fn print_list(memories: &[Memory], json: bool, with_state: bool) {
    if json {
        output::stdout_json(&memories);
        return;
    }
    if memories.is_empty() {
        output::stdout("no memories\n");
        return;
    }
    let text_of = |m: &Memory| {
        let flat: String = m.content.split_whitespace().collect::<Vec<_>>().join(" ");
        match archon_engine::text::split_at_chars(&flat, TEXT_CHARS) {
            Some((head, _)) => format!("{head}…"),
            None => flat,
        }
    };
    let created = |m: &Memory| {
        timestamp(u64::try_from(m.created_ms).unwrap_or(0))
            .chars()
            .take(10)
            .collect::<String>()
    };
    let text = if with_state {
        let rows: Vec<[String; 5]> = memories
            .iter()
            .map(|m| {
                let state = match (m.superseded_by, m.forgotten_ms) {
                    (_, Some(_)) => "forgotten".to_owned(),
                    (Some(by), None) => format!("replaced by {by}"),
                    (None, None) => "live".to_owned(),
                };
                [
                    m.id.to_string(),
                    m.kind.as_str().to_owned(),
                    created(m),
                    state,
                    text_of(m),
                ]
            })
            .collect();
        table(&["ID", "KIND", "CREATED", "STATE", "TEXT"], &rows)
    } else {
        let rows: Vec<[String; 3]> = memories
            .iter()
            .map(|m| [m.id.to_string(), created(m), text_of(m)])
            .collect();
        table(&["ID", "CREATED", "TEXT"], &rows)
    };
    output::stdout(&output::printable(&text));
}
