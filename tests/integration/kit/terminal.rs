//! A terminal, as a person sees it: a command run in a detached tmux pane,
//! its screen captured as it goes.

use std::time::Duration;

/// Runs `command` in a 200x20 tmux pane and returns every screen captured
/// (five a second) until one contains `done`, or after 30 s.
pub async fn tmux_screens(name: &str, command: &str, done: &str) -> Vec<String> {
    let session = format!("{name}-{}", std::process::id());
    let tmux = |args: &[&str]| {
        std::process::Command::new("tmux")
            .args(args)
            .output()
            .expect("tmux (scripts/dev test installs it)")
    };
    // The pane stays open after the command, so that its last screen can be read.
    let command = format!("{command}; sleep 60");
    let started = tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "200",
        "-y",
        "20",
        &command,
    ]);
    assert!(
        started.status.success(),
        "{}",
        String::from_utf8_lossy(&started.stderr)
    );
    let mut screens = Vec::new();
    for _ in 0..150 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let screen =
            String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", &session]).stdout).into_owned();
        let finished = screen.contains(done);
        screens.push(screen);
        if finished {
            break;
        }
    }
    tmux(&["kill-session", "-t", &session]);
    screens
}
