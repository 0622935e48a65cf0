//! Child processes: the commands a run starts and everything they leave behind, the `/proc` facts resume
//! reads about a crashed run's commands, and the killable helper processes that evaluate jq filters and
//! templates that could outgrow their inputs, under limits of their own ([`HelperLimits`]).
//!
//! A command runs as the leader of its own process group, with [`TAG_VAR`] in its environment. When it
//! exits, or is abandoned (timeout, cancellation), [`Tracked`] kills what it leaves: its group, and every
//! process descended from it, including those that left the group and the session (`setsid`). Those are
//! found because archon is a child subreaper ([`become_subreaper`]): an orphan is reparented to archon
//! rather than to init, and it carries the command's tag (or group) to say whose it is.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// The environment variable each command carries (and its descendants inherit): which command a process
/// that left the command's process group belongs to.
pub const TAG_VAR: &str = "ARCHON_PROCESS_TAG";

/// Why a helper process could not be run.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("cannot start the helper `{program}`: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the helper `{program}` did not finish: {source}")]
    Wait {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot make archon a child subreaper: {source}")]
    Subreaper {
        #[source]
        source: nix::Error,
    },
}

/// Makes this process the reaper of its orphaned descendants, so that a command's children that escape
/// into a new session stay findable (Linux `PR_SET_CHILD_SUBREAPER`). The `archon` binary does this at
/// start; an embedding program may, knowing that it then reaps its own children's orphans.
pub fn become_subreaper() -> Result<(), ProcessError> {
    nix::sys::prctl::set_child_subreaper(true).map_err(|source| ProcessError::Subreaper { source })
}

/// When process `pid` started, in clock ticks since boot (Linux `/proc`), or `None` when it is gone.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces) start with the state; start time is the
    // 22nd field, the 20th after the name.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process group a crashed attempt started still runs something: its leader (the same
/// process, not a later one with the same id), or, once the leader has exited, a process it left in the
/// group (a server's child that outlived it), started no earlier than the leader.
pub fn leftover_group(pgid: u32, started: Option<u64>) -> bool {
    let Some(started) = started else {
        return false;
    };
    match process_start_time(pgid) {
        // A process has the leader's id: the group is ours only if it is the same process.
        Some(leader) if !zombie(pgid) => leader == started,
        _ => group_members(pgid).any(|(pid, start)| start >= started && !zombie(pid)),
    }
}

/// The processes of group `pgid`, with their start times, as `/proc` lists them.
fn group_members(pgid: u32) -> impl Iterator<Item = (u32, u64)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(move |pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (_, rest) = stat.rsplit_once(')')?;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            // After the name: state, ppid, pgrp, ..., start time (the 20th after the name).
            let group: u32 = fields.get(2)?.parse().ok()?;
            let start: u64 = fields.get(19)?.parse().ok()?;
            (group == pgid).then_some((pid, start))
        })
}

/// Whether process `pid` has exited and waits only to be reaped (an orphan whose new parent does not reap
/// it stays so): it runs nothing any more.
fn zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let (_, rest) = stat.rsplit_once(')')?;
            rest.split_whitespace().next().map(|state| state == "Z")
        })
        .unwrap_or(false)
}

/// Kills a leftover process group (see [`leftover_group`]).
pub fn kill_group(pgid: u32) {
    if let Some(pgid) = pid(pgid) {
        let _ = killpg(pgid, Signal::SIGKILL);
    }
}

fn pid(raw: u32) -> Option<Pid> {
    i32::try_from(raw)
        .ok()
        .filter(|p| *p > 0)
        .map(Pid::from_raw)
}

/// The leaders archon started and still waits for. Orphans reparented to archon are told from them by
/// this set, without reading their environment.
static LIVE: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

fn live() -> std::sync::MutexGuard<'static, BTreeSet<u32>> {
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A fresh tag for one command: unique within this process, and across processes by the process id.
pub fn new_tag() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A command archon started and waits for: the leader of its own process group, tagged with [`TAG_VAR`].
/// Dropped before [`Tracked::exited`], the command was abandoned: the leader, its group and all its
/// descendants are killed.
#[derive(Debug)]
pub struct Tracked {
    leader: u32,
    tag: String,
    exited: bool,
}

impl Tracked {
    /// Tracks `leader`, just spawned with `tag` in its environment and as its own process group.
    pub fn new(leader: u32, tag: String) -> Self {
        live().insert(leader);
        Tracked {
            leader,
            tag,
            exited: false,
        }
    }

    /// The leader exited (and was waited for): kills whatever it left running.
    pub fn exited(mut self) {
        self.exited = true;
        live().remove(&self.leader);
        sweep(self.leader, &self.tag, false);
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if !self.exited {
            live().remove(&self.leader);
            sweep(self.leader, &self.tag, true);
        }
    }
}

/// Stops, then kills, the group `leader` led and every process descended from the command: from the
/// leader while it lives, and from the orphans reparented to archon that carry its group or tag.
///
/// Every process found is stopped before its children are listed, so that none can fork a child the
/// walk misses (a signal pending during `fork` cancels it); the kills come once the whole tree is frozen.
fn sweep(leader: u32, tag: &str, leader_alive: bool) {
    let Some(group) = pid(leader) else { return };
    let _ = killpg(group, Signal::SIGSTOP);
    let own = std::process::id();
    let mut roots = Vec::new();
    if leader_alive {
        roots.push(leader);
    }
    let mut orphans = Vec::new();
    {
        let live = live();
        for child in children(own) {
            if live.contains(&child) || child == leader {
                continue;
            }
            let Some(stat) = Stat::read(child) else {
                continue;
            };
            if stat.pgid == leader || has_tag(child, tag) {
                roots.push(child);
                orphans.push(child);
            }
        }
    }
    if roots.is_empty() {
        let _ = killpg(group, Signal::SIGKILL);
        return;
    }
    let mut seen = HashSet::new();
    while let Some(next) = roots.pop() {
        if !seen.insert(next) {
            continue;
        }
        let Some(process) = pid(next) else { continue };
        let _ = kill(process, Signal::SIGSTOP);
        roots.extend(children(next));
    }
    let _ = killpg(group, Signal::SIGKILL);
    for process in seen.iter().filter_map(|p| pid(*p)) {
        let _ = kill(process, Signal::SIGKILL);
    }
    if !orphans.is_empty() {
        // The orphans are archon's children now and nobody else will wait for them. They are dying from
        // SIGKILL, but not necessarily dead yet: a thread waits, so that the caller does not.
        let _ = std::thread::Builder::new()
            .name("archon-reaper".into())
            .spawn(move || {
                for orphan in orphans.into_iter().filter_map(pid) {
                    let _ = nix::sys::wait::waitpid(orphan, None);
                }
            });
    }
}

/// The children of `pid`, all its threads' (`/proc/<pid>/task/<tid>/children`).
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for task in tasks.flatten() {
        let mut path = task.path();
        path.push("children");
        if let Ok(text) = std::fs::read_to_string(path) {
            found.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    found
}

/// The fields of `/proc/<pid>/stat` a sweep reads.
struct Stat {
    pgid: u32,
}

impl Stat {
    fn read(pid: u32) -> Option<Stat> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command name: state, parent, process group.
        let (_, rest) = stat.rsplit_once(')')?;
        let pgid = rest.split_whitespace().nth(2)?.parse().ok()?;
        Some(Stat { pgid })
    }
}

/// Whether `pid` was started with `TAG_VAR=tag` in its environment.
fn has_tag(pid: u32, tag: &str) -> bool {
    let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let wanted = format!("{TAG_VAR}={tag}");
    environ
        .split(|b| *b == 0)
        .any(|entry| entry == wanted.as_bytes())
}

/// What a helper process did.
#[derive(Debug)]
pub struct HelperOutput {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    /// Whether `stdout` was cut at the limit the caller gave.
    pub stdout_truncated: bool,
    pub stderr: Vec<u8>,
}

/// Most bytes of a helper's standard error kept: enough for the message a crash leaves.
const HELPER_STDERR_BYTES: usize = 64 * 1024;

/// Runs `program args…` with `input` on its standard input, as a process of its own that is killed when
/// the returned future is dropped (timeout, cancellation): the way to do CPU-bound work on untrusted
/// input that a thread could neither interrupt nor survive.
pub async fn run_helper(
    program: &Path,
    args: &[&str],
    input: Vec<u8>,
    max_stdout: usize,
) -> Result<HelperOutput, ProcessError> {
    let name = || program.display().to_string();
    let tag = new_tag();
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env(TAG_VAR, &tag)
        // mimalloc (the `archon` executable's allocator) reserves 1 GiB of address space at start
        // unless told not to; reserved, it would count as data already held, and the helper's memory
        // limit would be that much larger than it says.
        .env("MIMALLOC_ARENA_RESERVE", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| ProcessError::Spawn {
            program: name(),
            source,
        })?;
    let tracked = child.id().map(|leader| Tracked::new(leader, tag));
    let stdin = child.stdin.take();
    let feed = async move {
        if let Some(mut stdin) = stdin {
            // A helper that stops reading (it failed early) closes the pipe: not an error here.
            let _ = stdin.write_all(&input).await;
        }
    };
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    let out = child.stdout.take();
    let err = child.stderr.take();
    let (mut out_dropped, mut err_dropped) = (0, 0);
    let ((), (), (), status) = tokio::join!(
        feed,
        read_into(out, &mut stdout, &mut out_dropped, max_stdout),
        read_into(err, &mut stderr, &mut err_dropped, HELPER_STDERR_BYTES),
        child.wait()
    );
    let status = status.map_err(|source| ProcessError::Wait {
        program: name(),
        source,
    })?;
    if let Some(tracked) = tracked {
        tracked.exited();
    }
    Ok(HelperOutput {
        status,
        stdout,
        stdout_truncated: out_dropped > 0,
        stderr,
    })
}

/// Reads `stream` to its end into `kept`, keeping at most `limit` bytes and counting the rest in
/// `dropped`. What was read stays in `kept` if the future is dropped before the end.
pub async fn read_into(
    stream: Option<impl AsyncRead + Unpin>,
    kept: &mut Vec<u8>,
    dropped: &mut usize,
    limit: usize,
) {
    let Some(mut stream) = stream else { return };
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = limit.saturating_sub(kept.len());
                kept.extend_from_slice(&buffer[..n.min(room)]);
                *dropped += n.saturating_sub(room);
            }
        }
    }
}

/// What a helper process may use: memory and CPU time (its stack is the thread it evaluates on).
#[derive(Debug, Clone, Copy)]
pub struct HelperLimits {
    /// Most memory (data: heap and thread stacks) beyond what the process held when it limited itself.
    pub memory_bytes: u64,
    /// Most CPU time: `SIGXCPU` at this soft limit, `SIGKILL` five seconds later.
    pub cpu_seconds: u64,
}

impl HelperLimits {
    /// Limits this process (the helper's side, first thing): memory, CPU time, and no core dump when a
    /// runaway evaluation aborts it.
    pub fn apply(self) {
        use nix::sys::resource::{Resource, setrlimit};
        let _ = setrlimit(Resource::RLIMIT_CORE, 0, 0);
        // On top of what the process already holds: an allocator may reserve a large arena at start, which
        // counts as data although it is not used yet.
        let data = data_bytes().saturating_add(self.memory_bytes);
        let _ = setrlimit(Resource::RLIMIT_DATA, data, data);
        let _ = setrlimit(Resource::RLIMIT_CPU, self.cpu_seconds, self.cpu_seconds + 5);
    }

    /// Why a helper that did not exit normally failed, as words to follow its subject ("jq filter `…`
    /// recursed too deeply"): too deep a recursion, too much memory, too much CPU time, another signal,
    /// or the last line it left.
    pub fn failure(self, output: &HelperOutput) -> String {
        use std::os::unix::process::ExitStatusExt;
        let stderr = String::from_utf8_lossy(&output.stderr);
        let signal = output.status.signal();
        if stderr.contains("has overflowed its stack") {
            "recursed too deeply".to_owned()
        } else if stderr.contains("memory allocation of") {
            format!("needed more than {} MiB of memory", self.memory_bytes >> 20)
        } else if signal == Some(Signal::SIGXCPU as i32) {
            format!("used more than {} s of CPU time", self.cpu_seconds)
        } else {
            let last = stderr.lines().last().unwrap_or_default().trim();
            match (signal, last.is_empty()) {
                (Some(signal), _) => format!("failed: its process was killed by signal {signal}"),
                (None, true) => format!("failed: {}", output.status),
                (None, false) => format!("failed: {last}"),
            }
        }
    }
}

/// This process's data segment now (`VmData` of `/proc/self/status`), in bytes.
fn data_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmData:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kib| kib * 1024)
}
