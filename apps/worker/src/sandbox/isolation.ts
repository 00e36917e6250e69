import { spawnSync } from "node:child_process";

/** Whether bubblewrap can actually start here (it needs user namespaces, which some hosts forbid). */
export function bwrapUsable(): boolean {
  const r = spawnSync("bwrap", ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "true"], { stdio: "ignore" });
  return r.status === 0;
}

/**
 * Wraps an argv in bubblewrap: the whole filesystem read-only, the sandbox folders (working
 * directory, HOME, TMPDIR) the only writable path (plus a private /tmp), a private PID namespace, and death with the worker. The
 * network stays shared: the agent must reach the gateway.
 */
export function bwrapArgv(writable: string, cwd: string, argv: string[]): string[] {
  return [
    "bwrap",
    "--ro-bind", "/", "/",
    "--dev", "/dev",
    "--proc", "/proc",
    "--tmpfs", "/tmp",
    "--bind", writable, writable,
    "--chdir", cwd,
    "--unshare-pid",
    "--die-with-parent",
    "--",
    ...argv,
  ];
}
