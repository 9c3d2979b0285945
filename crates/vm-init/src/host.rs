//! The host side of one microVM sandbox, as a process of its own:
//! `cordon-vm-init host DIR`.
//!
//! cordon's supervisor runs it as pid 1 of the sandbox's pid, mount and
//! network namespaces, in the sandbox's cgroup slot, with the jail's stdio
//! relay on its own stdin, stdout and stderr (QEMU's stdio is not the
//! guest's). It reads the [`Job`] the runtime wrote to `DIR/job.json`,
//! starts QEMU (dropped to the job's uid and gid when run as root), boots
//! or restores the guest, streams its stdin to the guest's stdin port and
//! the guest's stdout and stderr ports to its own, writes how the task
//! ended to `DIR/status.json` ([`Status`]) and exits like the tool: its exit
//! code, `128 + signal` for a signal. The jail keeps the wall clock and the
//! output caps: when it kills this process, the pid namespace ends and
//! QEMU with it.
//!
//! For a task with `net` ports the helper serves the guest's network
//! channel (`crate::relay::serve_host`, through [`Vm::run_io`]): each
//! connection the tool makes to one of those ports on the guest's loopback
//! becomes a connection to the same port on 127.0.0.1 of the helper's own
//! network namespace, where cordon's egress doors listen; a refused
//! connect is a reset of the guest's connection.
//!
//! A template job boots the guest with its RAM in `DIR/vm/template.ram`,
//! to its init's `ready` line, snapshots its device state into
//! `DIR/vm/template.snap` (the runtime moves both into its store) and
//! exits 0; it runs no task.
//!
//! A restore job names the template's two files as the runtime verified
//! them, and the helper checks that what QEMU gets is what was verified:
//! it copies the (small) device state into `DIR/vm/` and checks its
//! sha256 on the copy QEMU reads; it opens the RAM file, checks that the
//! descriptor's file is the one the runtime hashed (device, inode, size,
//! modification and change time), and binds that very file read-only at
//! `DIR/vm/ram`, the path QEMU maps (privately: the guest's writes never
//! reach it).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::image::FileId;
use crate::protocol::Task;
use crate::qemu::{Outcome, Snapshot, Vm, VmConfig};

/// The job file's name in the sandbox's directory.
pub const JOB: &str = "job.json";
/// The status file's name in the sandbox's directory.
pub const STATUS: &str = "status.json";
/// The subdirectory QEMU's sockets, console and snapshot go in (owned by
/// QEMU's ids).
pub const VM_DIR: &str = "vm";
/// Where a template job leaves its device state, in [`VM_DIR`].
pub const TEMPLATE_SNAPSHOT: &str = "template.snap";
/// Where a template job leaves its RAM file, in [`VM_DIR`].
pub const TEMPLATE_RAM: &str = "template.ram";

/// The exit code when the host side failed (nothing of the tool ran, or
/// its end is unknown); `DIR/status.json` says why.
pub const EXIT_HOST_ERROR: i32 = 125;

/// How the guest starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Start {
    /// A cold boot.
    Cold,
    /// A restore of a template's snapshot.
    Restore {
        /// The device state.
        snapshot: PathBuf,
        /// Its sha256 (checked on the helper's own copy).
        state_sha256: String,
        /// The template's RAM file.
        ram: PathBuf,
        /// The RAM file as the runtime verified its digest.
        ram_id: FileId,
    },
    /// Boot, snapshot at `ready`, end: no task.
    Template,
}

/// What the runtime asks of one helper.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    pub vm: VmConfig,
    pub start: Start,
    /// The tool's task (none for a template).
    pub task: Option<Task>,
    /// QEMU's uid and gid, when the helper runs as root.
    pub qemu_ids: Option<(u32, u32)>,
    /// Replace `/dev` of the helper's own mount namespace by the nodes
    /// QEMU needs ([`crate::devices`]) before QEMU starts.
    #[serde(default)]
    pub confine_dev: bool,
    /// Give QEMU a root of its own ([`crate::root`]) holding only these
    /// paths read-only (its loader, libraries and firmware) besides the
    /// guest's kernel, initramfs and image, the sandbox's directory and
    /// `/dev`; `None`: QEMU sees the helper's whole file view.
    #[serde(default)]
    pub qemu_root: Option<Vec<PathBuf>>,
    /// The tool's wall clock in milliseconds, kept here from the task's
    /// start (a cold boot, whose time is not the tool's); `None`: the
    /// supervisor's clock alone.
    #[serde(default)]
    pub wall_ms: Option<u64>,
}

/// How the task ended, as the helper saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "end", rename_all = "snake_case", deny_unknown_fields)]
pub enum End {
    /// The tool exited with `code`.
    Exited { code: i32 },
    /// The tool was killed by `signal`; `oom`: by the guest's OOM killer.
    Signaled { signal: i32, oom: bool },
    /// The guest's init could not run the task.
    GuestError { stage: String, message: String },
    /// The guest went away without a status (`panic`: a kernel panic).
    GuestDied { panic: bool, console: String },
    /// The tool outlived the job's wall clock (`wall_ms`) and the guest
    /// was killed.
    WallClock { after_ms: u64 },
    /// The host side failed before or while the guest ran.
    HostError { message: String },
    /// A template was snapshotted.
    Snapshotted,
}

/// `DIR/status.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    #[serde(flatten)]
    pub end: End,
    /// From QEMU's start to the guest ready (cold) or running (restored).
    pub ready_ms: u64,
    /// From the task sent to its status.
    pub task_ms: u64,
    /// How the guest broke the network channel's protocol (its network
    /// was cut then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_error: Option<String>,
}

impl Status {
    /// The exit code the helper ends with.
    pub fn exit_code(&self) -> i32 {
        match &self.end {
            End::Exited { code } => *code,
            End::Signaled { signal, .. } => 128 + signal,
            End::Snapshotted => 0,
            _ => EXIT_HOST_ERROR,
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runs the job in `dir` and returns the exit code (after writing
/// `dir/status.json`).
pub fn main(dir: &Path) -> i32 {
    let status = match run(dir) {
        Ok(s) => s,
        Err(message) => Status {
            end: End::HostError { message },
            ready_ms: 0,
            task_ms: 0,
            net_error: None,
        },
    };
    let code = status.exit_code();
    if let Err(e) = write_status(dir, &status) {
        eprintln!("cordon-vm-init host: {e}");
        return EXIT_HOST_ERROR;
    }
    code
}

fn write_status(dir: &Path, status: &Status) -> Result<(), String> {
    let text = serde_json::to_vec(status).map_err(|e| format!("encode the status: {e}"))?;
    let tmp = dir.join(".status.tmp");
    let path = dir.join(STATUS);
    fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(&text))
        .and_then(|()| fs::rename(&tmp, &path))
        .map_err(|e| format!("write {}: {e}", path.display()))
}

fn run(dir: &Path) -> Result<Status, String> {
    let job_path = dir.join(JOB);
    let text = fs::read(&job_path).map_err(|e| format!("read {}: {e}", job_path.display()))?;
    let job: Job =
        serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", job_path.display()))?;
    let vm_dir = dir.join(VM_DIR);
    fs::create_dir_all(&vm_dir).map_err(|e| format!("create {}: {e}", vm_dir.display()))?;
    if let Some((uid, gid)) = job.qemu_ids {
        std::os::unix::fs::chown(&vm_dir, Some(uid), Some(gid))
            .map_err(|e| format!("chown {}: {e}", vm_dir.display()))?;
    }
    if job.confine_dev {
        crate::devices::confine(&dir.join("dev"), job.vm.accel == crate::qemu::Accel::Kvm)?;
    }
    // The snapshot is checked and bound before QEMU's root is made: its
    // files are in the store, which that root does not hold.
    let snap = match &job.start {
        Start::Restore {
            snapshot,
            state_sha256,
            ram,
            ram_id,
        } => Some(checked_snapshot(
            &vm_dir,
            snapshot,
            state_sha256,
            ram,
            ram_id,
        )?),
        Start::Cold | Start::Template => None,
    };
    if let Some(own) = &job.qemu_root {
        let mut readonly = vec![
            job.vm.qemu.clone(),
            job.vm.kernel.clone(),
            job.vm.initramfs.clone(),
            job.vm.image.path.clone(),
        ];
        readonly.extend(job.vm.carry.iter().map(|c| c.path.clone()));
        readonly.extend(own.iter().cloned());
        if let Some(s) = &snap {
            readonly.push(s.ram.clone());
        }
        // A template's guest directory is a link to the store's
        // temporary directory, where its snapshot is written: bound
        // writable too, at its own path.
        let mut writable = vec![dir.to_path_buf()];
        let real = fs::canonicalize(&vm_dir)
            .map_err(|e| format!("QEMU's root: {}: {e}", vm_dir.display()))?;
        let real_dir =
            fs::canonicalize(dir).map_err(|e| format!("QEMU's root: {}: {e}", dir.display()))?;
        if !real.starts_with(&real_dir) {
            writable.push(real);
        }
        crate::root::confine(&dir.join("root"), &readonly, &writable)?;
    }
    let vm = match (&job.start, &snap) {
        (Start::Cold, _) => Vm::boot_as(&job.vm, &vm_dir, job.qemu_ids),
        (Start::Template, _) => {
            Vm::boot_template(&job.vm, &vm_dir, &vm_dir.join(TEMPLATE_RAM), job.qemu_ids)
        }
        (Start::Restore { .. }, Some(snap)) => Vm::restore_as(&job.vm, snap, &vm_dir, job.qemu_ids),
        (Start::Restore { .. }, None) => return Err("the snapshot was not checked".to_owned()),
    }
    .map_err(|e| format!("start the guest: {e}"))?;
    let ready_ms = ms(vm.ready_after);
    if job.start == Start::Template {
        let snap = vm
            .snapshot(&vm_dir.join(TEMPLATE_SNAPSHOT))
            .map_err(|e| format!("snapshot the template: {e}"))?;
        // Before the RAM file is hashed and recorded: its zero pages
        // made holes.
        crate::holes::punch_zero_pages(&snap.ram)
            .map_err(|e| format!("the template's RAM file {}: {e}", snap.ram.display()))?;
        return Ok(Status {
            end: End::Snapshotted,
            ready_ms,
            task_ms: 0,
            net_error: None,
        });
    }
    let task = job
        .task
        .as_ref()
        .ok_or_else(|| "the job has no task".to_owned())?;
    let ran = vm
        .run_io(
            task,
            std::io::stdin(),
            std::io::stdout(),
            std::io::stderr(),
            job.wall_ms.map(Duration::from_millis),
        )
        .map_err(|e| format!("run the task: {e}"))?;
    let end = match ran.outcome {
        Outcome::Exited(code) => End::Exited { code },
        Outcome::Signaled { signal, oom } => End::Signaled { signal, oom },
        Outcome::GuestError { stage, message } => End::GuestError { stage, message },
        Outcome::GuestDied { panic, console } => End::GuestDied { panic, console },
        Outcome::WallClock => End::WallClock {
            after_ms: job.wall_ms.unwrap_or_default(),
        },
    };
    Ok(Status {
        end,
        ready_ms,
        task_ms: ms(ran.task_time),
        net_error: ran.net_error,
    })
}

/// The snapshot QEMU gets, in `vm_dir`: a copy of the device state
/// whose sha256 is `state_sha256`, and the RAM file `ram`, if it is still
/// the file `ram_id` names, bound read-only at `vm_dir/ram`.
fn checked_snapshot(
    vm_dir: &Path,
    state: &Path,
    state_sha256: &str,
    ram: &Path,
    ram_id: &FileId,
) -> Result<Snapshot, String> {
    let (bytes, file) = check_snapshot(state, state_sha256, ram, ram_id)?;
    let copy = vm_dir.join("state");
    fs::write(&copy, &bytes).map_err(|e| format!("write {}: {e}", copy.display()))?;
    // QEMU (the sandbox's ids) only reads it.
    fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o444))
        .map_err(|e| format!("chmod {}: {e}", copy.display()))?;
    let bound = vm_dir.join("ram");
    crate::devices::bind_file_readonly(&file, &bound)?;
    Ok(Snapshot {
        state: copy,
        ram: bound,
    })
}

/// The device state's bytes, if their sha256 is `state_sha256`, and the
/// RAM file open, if it is the version `ram_id` names.
fn check_snapshot(
    state: &Path,
    state_sha256: &str,
    ram: &Path,
    ram_id: &FileId,
) -> Result<(Vec<u8>, fs::File), String> {
    let bytes = fs::read(state).map_err(|e| format!("read {}: {e}", state.display()))?;
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&bytes))
    };
    if sha != state_sha256 {
        return Err(format!(
            "{} is corrupt: its sha256 is {sha}, its record says {state_sha256}; refusing to restore it",
            state.display()
        ));
    }
    let file = fs::File::open(ram).map_err(|e| format!("open {}: {e}", ram.display()))?;
    let now = file
        .metadata()
        .map(|m| FileId::of(&m))
        .map_err(|e| format!("stat {}: {e}", ram.display()))?;
    if now != *ram_id {
        return Err(format!(
            "{} changed since its digest was verified ({now:?}, verified as {ram_id:?}); refusing to restore it",
            ram.display()
        ));
    }
    Ok((bytes, file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_tool() {
        let s = |end| Status {
            end,
            ready_ms: 1,
            task_ms: 2,
            net_error: None,
        };
        assert_eq!(s(End::Exited { code: 3 }).exit_code(), 3);
        assert_eq!(
            s(End::Signaled {
                signal: 9,
                oom: true
            })
            .exit_code(),
            137
        );
        assert_eq!(
            s(End::HostError {
                message: "x".into()
            })
            .exit_code(),
            EXIT_HOST_ERROR
        );
        let text = serde_json::to_string(&s(End::Signaled {
            signal: 9,
            oom: true,
        }))
        .unwrap();
        assert_eq!(
            text,
            r#"{"end":"signaled","signal":9,"oom":true,"ready_ms":1,"task_ms":2}"#
        );
        let back: Status = serde_json::from_str(&text).unwrap();
        assert_eq!(back.exit_code(), 137);
        assert_eq!(back.net_error, None);
    }

    #[test]
    fn a_snapshot_is_checked_before_qemu_gets_it() {
        use sha2::Digest;
        let d = tempfile::tempdir().unwrap();
        let state = d.path().join("t.snap");
        let ram = d.path().join("t.ram");
        fs::write(&state, b"device state").unwrap();
        fs::write(&ram, vec![7u8; 8192]).unwrap();
        let sha = hex::encode(sha2::Sha256::digest(b"device state"));
        let id = FileId::path(&ram).unwrap();
        // Positive control: what was verified passes.
        let (bytes, _) = check_snapshot(&state, &sha, &ram, &id).unwrap();
        assert_eq!(bytes, b"device state");
        // Another device state.
        let e = check_snapshot(&state, &"0".repeat(64), &ram, &id).unwrap_err();
        assert!(e.contains("is corrupt"), "{e}");
        // The RAM file written since it was verified (its times move), and
        // one replaced by another file.
        std::thread::sleep(Duration::from_millis(20));
        fs::OpenOptions::new()
            .write(true)
            .open(&ram)
            .and_then(|mut f| f.write_all(&[8]))
            .unwrap();
        let e = check_snapshot(&state, &sha, &ram, &id).unwrap_err();
        assert!(e.contains("changed since its digest was verified"), "{e}");
        let other = d.path().join("other");
        fs::write(&other, vec![7u8; 8192]).unwrap();
        fs::rename(&other, &ram).unwrap();
        let e = check_snapshot(&state, &sha, &ram, &id).unwrap_err();
        assert!(e.contains("changed since its digest was verified"), "{e}");
    }

    #[test]
    fn a_broken_network_channel_is_in_the_status() {
        let s = Status {
            end: End::Exited { code: 0 },
            ready_ms: 1,
            task_ms: 2,
            net_error: Some("stream 3 went past its window".into()),
        };
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(
            text,
            r#"{"end":"exited","code":0,"ready_ms":1,"task_ms":2,"net_error":"stream 3 went past its window"}"#
        );
        let back: Status = serde_json::from_str(&text).unwrap();
        assert_eq!(back, s);
    }
}
