//! Child processes with a timeout, their pipes drained on threads of their own.

/// What a child process did: its exit status (None: killed at the timeout), its stdout,
/// its stderr when captured, and its seconds.
pub(crate) struct Ran {
    pub(crate) status: Option<std::process::ExitStatus>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    pub(crate) secs: f64,
}

impl Ran {
    pub(crate) fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
    /// Why it failed, in one line: the exit status or the timeout, and stderr's last line.
    pub(crate) fn why(&self) -> String {
        let how = match self.status {
            None => format!("timed out after {:.0} s", self.secs),
            Some(s) => format!("{s}"),
        };
        match self.stderr.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(l) => format!("{how}: {}", l.trim().chars().take(160).collect::<String>()),
            None => how,
        }
    }
}

/// Reads a child's pipe on a thread of its own, chunk by chunk (a grandchild that keeps
/// the pipe open must not hang the check: the caller takes what came by a deadline).
pub(crate) fn drain<R: std::io::Read + Send + 'static>(
    r: Option<R>,
) -> Option<std::sync::mpsc::Receiver<Vec<u8>>> {
    let mut r = r?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut b = vec![0u8; 1 << 16];
        while let Ok(k) = r.read(&mut b) {
            if k == 0 || tx.send(b[..k].to_vec()).is_err() {
                break;
            }
        }
    });
    Some(rx)
}

/// What came through a pipe until it closed or until `deadline`.
pub(crate) fn collect(
    rx: Option<std::sync::mpsc::Receiver<Vec<u8>>>,
    deadline: std::time::Instant,
) -> String {
    let mut b = Vec::new();
    if let Some(rx) = rx {
        while let Ok(c) =
            rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
        {
            b.extend(c);
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

/// Runs `cmd` (stdin closed, stdout captured, stderr captured or passed through), killing
/// it after `timeout`.
pub(crate) fn run_child(
    mut cmd: std::process::Command,
    timeout: std::time::Duration,
    capture_stderr: bool,
) -> std::io::Result<Ran> {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    cmd.stderr(if capture_stderr {
        Stdio::piped()
    } else {
        Stdio::inherit()
    });
    let t0 = Instant::now();
    let mut child = cmd.spawn()?;
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if t0.elapsed() >= timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let secs = t0.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(5);
    Ok(Ran {
        status,
        stdout: collect(out, deadline),
        stderr: collect(err, deadline),
        secs,
    })
}
