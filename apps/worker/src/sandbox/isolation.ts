import { spawnSync } from "node:child_process";
import { closeSync, existsSync, lstatSync, openSync, readdirSync, readlinkSync, realpathSync, statSync } from "node:fs";
import path from "node:path";
import { CONTAINER_HOME, CONTAINER_TMP, DEFAULT_WORKDIR } from "./container-common.js";
import { seccompFilterFile } from "./seccomp.js";

/**
 * `runtime.isolation: "bwrap"`: every step of a local sandbox runs inside bubblewrap, which
 * gives it
 *
 * - a filesystem of its own: an empty root with, read-only, only what an agent needs — the
 *   system folders (/usr, /bin, /lib…), a short list of /etc files (users, DNS, TLS roots,
 *   the dynamic linker's cache), node's installation, every folder on the sandbox PATH (a
 *   `node_modules/.bin` brings its `node_modules` and the workspace packages it links to) and
 *   ROLLGATE_SANDBOX_BINDS (ROLLGATE_EVALUATOR_BINDS too, in evaluator steps only) — and,
 *   writable, its own folders (working directory, HOME, TMPDIR) and a private /tmp and
 *   /dev/shm of capped size (they are memory); the root and /dev are read-only. The worker's
 *   config and key files, other rollouts' folders, the Docker socket and every other unix
 *   socket of the host are simply not there.
 * - the same paths in every sandbox: its own folders are mounted where a container has them
 *   (INSIDE_WORKDIR, INSIDE_HOME, INSIDE_TMP), not at their host paths, which hold the task id
 *   and a random suffix. An agent that writes its working directory into its prompts (every
 *   agent CLI does) so sends the same prompt in every sandbox, as a branch's replay needs
 *   (docs/data-model.md#branches). (The host paths still show in /proc: bubblewrap's own
 *   command line, the mount table.)
 * - a private PID namespace and /proc: the worker's processes (and their /proc/<pid>/environ)
 *   are not visible; no capabilities (root in the sandbox is not root), no new user namespaces
 *   where bubblewrap can forbid them, at most ROLLGATE_SANDBOX_MAX_PROCS processes (prlimit; a
 *   root worker runs bubblewrap as an unprivileged user, whom the limit binds), at most
 *   ROLLGATE_SANDBOX_PROCESS_MEMORY_MB of memory per process, the OOM killer's first choice, a
 *   seccomp filter (seccomp.ts), and it dies with the worker.
 * - with `runtime.network: "sealed"` (the default with bwrap): its own network namespace, with
 *   nothing but loopback. The worker's relay for the sandbox (relay.ts) is bind-mounted as a
 *   unix socket at RELAY_DIR, and a shim (relay-shim.ts) listening on
 *   127.0.0.1:SANDBOX_GATEWAY_PORT inside the namespace carries the agent's connections to it.
 *   `host`: the host's network, as without isolation.
 */

/** Where a sandbox's own folders appear inside it: where a container has them. */
export const INSIDE_WORKDIR = DEFAULT_WORKDIR;
export const INSIDE_HOME = CONTAINER_HOME;
export const INSIDE_TMP = CONTAINER_TMP;

/** Where the relay's socket and the shim appear inside a sealed sandbox. */
export const RELAY_DIR = "/run/rollgate";
export const RELAY_SOCKET = "gateway.sock";
export const RELAY_SHIM = "shim.mjs";
/** The port of the gateway relay on a sealed sandbox's loopback (its own namespace: no clash with the host). */
export const SANDBOX_GATEWAY_PORT = 47811;

/** What bubblewrap can do on this host (probed once at worker start). */
export interface BwrapSupport {
  /** bubblewrap starts at all. */
  usable: boolean;
  /** It can give a sandbox its own network namespace (needed for `runtime.network: "sealed"`). */
  netns: boolean;
  /** It can run the sandbox in a user namespace of its own, and forbid new ones inside (bubblewrap >= 0.8). */
  userns: "disable-nested" | "own" | "none";
  /** It can cap a tmpfs's size (`--size`, bubblewrap >= 0.7): a sandbox's /tmp and /dev/shm are memory. */
  sizedTmpfs?: boolean;
  /** util-linux's prlimit under the system folders (seen inside every sandbox), which caps a sandbox's processes and their memory; null: none. */
  prlimit?: string | null;
  /** It can load a seccomp filter (`--seccomp FD`) as this user: the sandbox gets seccomp.ts's. */
  seccomp?: boolean;
  /** util-linux's choom, which makes a sandbox the out-of-memory killer's first choice; null: none. */
  choom?: string | null;
  /**
   * A worker running as root runs bubblewrap, and so the sandbox, as this unprivileged user
   * (util-linux's setpriv drops to it): root is exempt from RLIMIT_NPROC, the user is not. Null
   * or absent: the sandbox runs as the worker's own user (a worker that is not root, or a root
   * worker whose host does not let bubblewrap start as that user: see `userReason`).
   */
  user?: SandboxUser | null;
  /** Why a root worker's sandboxes run as root after all (no process limit binds them). */
  userReason?: string | null;
  /** What is missing and why, when something is. */
  reason: string | null;
}

/** The unprivileged user a root worker's sandboxes run as (ROLLGATE_SANDBOX_UID / ROLLGATE_SANDBOX_GID). */
export interface SandboxUser {
  uid: number;
  gid: number;
  /** util-linux's setpriv, which drops to it before bubblewrap starts. */
  setpriv: string;
}

/**
 * Who a root worker's sandboxes run as by default: nobody/nogroup. It has a passwd entry (tools
 * that look the user up work), owns nothing the sandbox sees, and RLIMIT_NPROC binds it; its count
 * is kept per user namespace (Linux 5.14 and later), so sandboxes sharing it do not share the limit.
 */
export const DEFAULT_SANDBOX_UID = 65534;
export const DEFAULT_SANDBOX_GID = 65534;

/** The argv prefix that runs a program as `user`, with no supplementary groups (the worker's are root's). */
export function dropTo(user: SandboxUser | null | undefined): string[] {
  return user ? [user.setpriv, `--reuid=${user.uid}`, `--regid=${user.gid}`, "--clear-groups", "--"] : [];
}

function tryBwrap(bin: string, args: string[], user?: SandboxUser | null, fd9?: number): { ok: boolean; err: string } {
  const argv = [...dropTo(user), bin];
  const r = spawnSync(argv[0]!, [...argv.slice(1), ...args, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "true"], {
    encoding: "utf8",
    timeout: 10_000,
    ...(fd9 !== undefined ? { stdio: ["ignore", "pipe", "pipe", "ignore", "ignore", "ignore", "ignore", "ignore", "ignore", fd9] } : {}),
  });
  if (r.error) return { ok: false, err: r.error.message };
  return { ok: r.status === 0, err: (r.stderr ?? "").trim().split("\n").pop() ?? `exit ${r.status}` };
}

/** Whether bubblewrap loads seccomp.ts's filter here (from descriptor 9, as bwrapArgv passes it). */
function probeSeccomp(bin: string, user: SandboxUser | null): boolean {
  const file = seccompFilterFile();
  if (!file || !existsSync("/bin/sh")) return false;
  const fd = openSync(file, "r");
  try {
    return tryBwrap(bin, ["--seccomp", "9"], user, fd).ok;
  } finally {
    closeSync(fd);
  }
}

export interface ProbeOptions {
  /** Who a root worker's sandboxes run as (default DEFAULT_SANDBOX_UID / GID); ignored when the worker is not root. */
  uid?: number;
  gid?: number;
  /** Whether the worker is root (default: its effective uid is 0). */
  root?: boolean;
}

/** The unprivileged user a root worker's sandboxes can run as here, or why none. */
function probeUser(bin: string, o: ProbeOptions): { user: SandboxUser | null; userReason: string | null } {
  if (!(o.root ?? process.geteuid?.() === 0)) return { user: null, userReason: null };
  const setpriv = ["/usr/bin/setpriv", "/bin/setpriv"].find((p) => existsSync(p));
  if (!setpriv) return { user: null, userReason: "util-linux's setpriv is not installed" };
  const user = { uid: o.uid ?? DEFAULT_SANDBOX_UID, gid: o.gid ?? DEFAULT_SANDBOX_GID, setpriv };
  const r = tryBwrap(bin, [], user);
  return r.ok ? { user, userReason: null } : { user: null, userReason: `bubblewrap cannot start as uid ${user.uid}: ${r.err}` };
}

/**
 * Finds out what bubblewrap can do here, by running it: as the user the sandboxes will run as (a
 * root worker's: an unprivileged one, when bubblewrap starts as it).
 */
export function probeBwrap(bin = "bwrap", o: ProbeOptions = {}): BwrapSupport {
  const { user, userReason } = probeUser(bin, o);
  const base = tryBwrap(bin, [], user);
  if (!base.ok) return { usable: false, netns: false, userns: "none", reason: `bubblewrap cannot start a sandbox here: ${base.err}` };
  const net = tryBwrap(bin, ["--unshare-net"], user);
  const userns = tryBwrap(bin, ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"], user).ok
    ? "disable-nested"
    : tryBwrap(bin, ["--unshare-user", "--cap-drop", "ALL"], user).ok
      ? "own"
      : "none";
  const sizedTmpfs = tryBwrap(bin, ["--size", "1048576", "--tmpfs", "/tmp"], user).ok;
  const prlimit = ["/usr/bin/prlimit", "/bin/prlimit"].find((p) => existsSync(p)) ?? null;
  const choom = ["/usr/bin/choom", "/bin/choom"].find((p) => existsSync(p)) ?? null;
  const seccomp = probeSeccomp(bin, user);
  return {
    choom,
    seccomp,
    usable: true,
    netns: net.ok,
    userns,
    sizedTmpfs,
    prlimit,
    user,
    userReason,
    reason: net.ok ? null : `bubblewrap cannot create a network namespace here: ${net.err}`,
  };
}

/** What the worker says at start about local sandboxes on this host. */
export function describeBwrap(s: BwrapSupport): string {
  if (!s.usable) {
    return `sandbox: ${s.reason}. Local tasks with runtime.isolation "bwrap" are refused (sandbox_unavailable); without it a local sandbox shares the worker's network and files.`;
  }
  if (!s.netns) {
    return `sandbox: ${s.reason}. Local bwrap tasks that need runtime.network "sealed" (the default) are refused (sandbox_unavailable); "host" runs them on the worker's network.`;
  }
  const memory = s.sizedTmpfs === false ? " This bubblewrap cannot cap a tmpfs's size (--size needs 0.7 or later): a sandbox's /tmp and /dev/shm may each take half the host's memory." : "";
  const user = s.user
    ? ` The worker is root: sandboxes run as uid ${s.user.uid}, gid ${s.user.gid} (ROLLGATE_SANDBOX_ROOT and the binds must be readable by it).`
    : s.userReason
      ? ` The worker is root and its sandboxes run as root (${s.userReason}): their process limit does not bind.`
      : "";
  const seccomp = s.seccomp ? " A seccomp filter denies io_uring, bpf, perf_event_open, userfaultfd and the key calls." : " No seccomp filter (this bubblewrap cannot load one, or this architecture has no table).";
  return `sandbox: local tasks with runtime.isolation "bwrap" are sealed: own network namespace (only their session, through the worker's relay, and runtime.egress), only the host paths an agent needs, private /proc.${memory}${user}${seccomp}`;
}

/** Read-only from the host, when they exist: the system folders. */
const SYSTEM_DIRS = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];

/** Read-only from the host's /etc, when they exist: what programs read to start, resolve names, check TLS. */
const ETC_ENTRIES = [
  "passwd",
  "group",
  "nsswitch.conf",
  "hosts",
  "host.conf",
  "resolv.conf",
  "gai.conf",
  "services",
  "protocols",
  "ld.so.cache",
  "ld.so.conf",
  "ld.so.conf.d",
  "localtime",
  "timezone",
  "os-release",
  "debian_version",
  "alternatives",
  "ssl",
  "ca-certificates",
  "ca-certificates.conf",
  "pki",
  "crypto-policies",
  "mime.types",
  "profile",
  "profile.d",
  "bash.bashrc",
  "inputrc",
  "terminfo",
  "fonts",
];

function lstatOrNull(p: string) {
  try {
    return lstatSync(p);
  } catch {
    return null;
  }
}

function isDir(p: string): boolean {
  try {
    return statSync(p).isDirectory();
  } catch {
    return false;
  }
}

/** The real paths a node_modules folder links to outside itself (npm workspaces: packages, apps…). */
function workspaceLinks(nodeModules: string): string[] {
  const out: string[] = [];
  const visit = (dir: string) => {
    let names: string[];
    try {
      names = readdirSync(dir);
    } catch {
      return;
    }
    for (const name of names) {
      const p = path.join(dir, name);
      if (name.startsWith("@") && dir === nodeModules) {
        visit(p);
        continue;
      }
      if (!lstatOrNull(p)?.isSymbolicLink()) continue;
      try {
        out.push(realpathSync(p));
      } catch {
        // a dangling link: nothing to bind
      }
    }
  };
  visit(nodeModules);
  return out;
}

/** `dirs` without any that is inside another one of them. */
function outermost(dirs: string[]): string[] {
  const sorted = [...new Set(dirs.map((d) => path.resolve(d)))].sort((a, b) => a.length - b.length);
  const kept: string[] = [];
  for (const d of sorted) if (!kept.some((k) => d === k || d.startsWith(k === "/" ? "/" : `${k}/`))) kept.push(d);
  return kept;
}

export interface HostMountOptions {
  /** The PATH sandboxed programs get: each of its folders is made visible (read-only). */
  sandboxPath: string;
  /** More host paths to make visible read-only (ROLLGATE_SANDBOX_BINDS). */
  extra?: string[];
  /** node's own binary (default: the worker's). */
  nodePath?: string;
}

/**
 * The bubblewrap arguments that make the host paths an agent needs visible, read-only: computed
 * once per worker (they do not change between rollouts).
 */
export function hostMountArgs(o: HostMountOptions): string[] {
  const args: string[] = [];
  const system: string[] = [];
  for (const p of SYSTEM_DIRS) {
    const st = lstatOrNull(p);
    if (st?.isSymbolicLink()) args.push("--symlink", readlinkSync(p), p);
    else if (st?.isDirectory()) {
      args.push("--ro-bind", p, p);
      system.push(p);
    }
  }
  for (const name of ETC_ENTRIES) {
    const p = path.join("/etc", name);
    if (lstatOrNull(p)) args.push("--ro-bind-try", p, p);
  }
  const wanted: string[] = [];
  // node's installation (its lib/node_modules holds globally installed CLIs).
  const nodeBin = path.dirname(realpathSync(o.nodePath ?? process.execPath));
  wanted.push(path.basename(nodeBin) === "bin" && path.dirname(nodeBin) !== "/" ? path.dirname(nodeBin) : nodeBin);
  for (const dir of o.sandboxPath.split(":")) {
    if (!path.isAbsolute(dir) || !isDir(dir)) continue;
    if (path.basename(dir) === ".bin" && path.basename(path.dirname(dir)) === "node_modules") {
      // Its entries link into node_modules, whose workspace packages link further out.
      const nm = path.dirname(dir);
      wanted.push(nm, ...workspaceLinks(nm));
    } else {
      wanted.push(dir);
    }
  }
  for (const p of o.extra ?? []) if (path.isAbsolute(p) && lstatOrNull(p)) wanted.push(p);
  for (const p of outermost(wanted)) {
    if (system.some((s) => p === s || p.startsWith(`${s}/`))) continue;
    args.push("--ro-bind", p, p);
  }
  return args;
}

export interface BwrapStep {
  support: BwrapSupport;
  /** hostMountArgs(), computed once. */
  hostMounts: string[];
  /**
   * The sandbox's own folders on the host, the only writable paths: mounted at INSIDE_WORKDIR
   * (also the steps' working directory), INSIDE_HOME and INSIDE_TMP.
   */
  dirs: { work: string; home: string; tmp: string };
  /** Sealed: the host folder holding the relay's socket and the shim, mounted at RELAY_DIR. Null: the host's network. */
  relayDir: string | null;
  /** node, to run the shim (default: the worker's). */
  nodePath?: string;
  /** The most bytes the sandbox's /tmp and its /dev/shm each hold (default DEFAULT_TMPFS_BYTES). */
  tmpfsBytes?: number;
  /** The most processes and threads the sandbox runs at once (default DEFAULT_MAX_PROCS). */
  maxProcs?: number;
  /** The most memory each of the sandbox's processes may take (RLIMIT_DATA; default DEFAULT_PROCESS_MEMORY_BYTES; 0: no limit). */
  processMemoryBytes?: number;
  /** seccomp.ts's filter as a file (where `support.seccomp`): opened as descriptor 9 for bubblewrap's `--seccomp 9`. */
  seccompFile?: string | null;
}

/**
 * The most memory one process of a sandbox may take by default (RLIMIT_DATA: its heap and private
 * writable mappings; address space merely reserved, as V8, Go and the JVM do, does not count). A
 * memory hog gets its allocation refused (Python's MemoryError, node's "out of memory") instead of
 * taking the host's memory. Per process: many processes together are bounded by the process limit
 * only, and beyond that by the out-of-memory killer, whose first choice is a sandbox
 * (SANDBOX_OOM_SCORE_ADJ), or by a cgroup the worker runs in.
 */
export const DEFAULT_PROCESS_MEMORY_BYTES = 8 * 1024 * 1024 * 1024;

/**
 * A sandbox's oom_score_adj: the highest, so when memory runs out the kernel kills a sandbox's
 * process before the worker, Redis or anything else of the host's. The sandbox cannot lower it
 * (that needs CAP_SYS_RESOURCE), and its children inherit it.
 */
export const SANDBOX_OOM_SCORE_ADJ = 1000;

/**
 * The most processes (threads included) a sandbox runs at once by default: a fork bomb, or a
 * runaway `make -j`, would otherwise take every process slot of the host, and the worker, Redis
 * and every other rollout could no longer start anything. RLIMIT_NPROC, set inside the sandbox's
 * own user namespace, so it counts the sandbox's processes only; root is exempt from it (run
 * workers as an unprivileged user).
 */
export const DEFAULT_MAX_PROCS = 4096;

/**
 * What a sandbox's /tmp and /dev/shm each hold at most by default. They are tmpfs: the host's
 * memory, owned by no process, so the OOM killer cannot win it back by killing the agent that
 * filled it (it kills the biggest process: the worker, Redis). Unbounded, each took half the
 * host's memory.
 */
export const DEFAULT_TMPFS_BYTES = 512 * 1024 * 1024;

/** The argv that runs `argv` as one step of a bubblewrap sandbox (see the module comment). */
export function bwrapArgv(s: BwrapStep, argv: string[]): string[] {
  const userns = s.support.userns === "disable-nested" ? ["--unshare-user", "--disable-userns"] : s.support.userns === "own" ? ["--unshare-user"] : [];
  const network = s.relayDir ? ["--unshare-net", "--ro-bind", s.relayDir, RELAY_DIR] : [];
  // --size where bubblewrap knows it; without it, /tmp and /dev/shm are as big as the kernel lets a tmpfs be.
  const size = s.support.sizedTmpfs ? ["--size", String(s.tmpfsBytes ?? DEFAULT_TMPFS_BYTES)] : [];
  const memory = s.processMemoryBytes ?? DEFAULT_PROCESS_MEMORY_BYTES;
  const limits = s.support.prlimit ? [s.support.prlimit, `--nproc=${s.maxProcs ?? DEFAULT_MAX_PROCS}`, ...(memory > 0 ? [`--data=${memory}`] : []), "--"] : [];
  const program = [
    ...limits,
    ...(s.relayDir ? [s.nodePath ?? process.execPath, `${RELAY_DIR}/${RELAY_SHIM}`, String(SANDBOX_GATEWAY_PORT), `${RELAY_DIR}/${RELAY_SOCKET}`, ...argv] : argv),
  ];
  const seccomp = s.support.seccomp && s.seccompFile;
  return [
    // The filter reaches bubblewrap as descriptor 9, opened by a shell that then becomes the step.
    ...(seccomp ? ["/bin/sh", "-c", 'exec "$@" 9<"$0"', s.seccompFile!] : []),
    // Outside, so bubblewrap's own processes are the OOM killer's first choice too.
    ...(s.support.choom ? [s.support.choom, "-n", String(SANDBOX_OOM_SCORE_ADJ), "--"] : []),
    ...dropTo(s.support.user),
    "bwrap",
    ...userns,
    "--cap-drop", "ALL",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--hostname", "sandbox",
    "--unshare-cgroup-try",
    "--die-with-parent",
    ...(seccomp ? ["--seccomp", "9"] : []),
    "--dev", "/dev",
    ...size, "--tmpfs", "/dev/shm",
    "--proc", "/proc",
    ...size, "--tmpfs", "/tmp",
    // Where some tools keep big temporary files: the same capped /tmp (the root is read-only).
    "--symlink", "/tmp", "/var/tmp",
    ...s.hostMounts,
    "--bind", s.dirs.work, INSIDE_WORKDIR,
    "--bind", s.dirs.home, INSIDE_HOME,
    "--bind", s.dirs.tmp, INSIDE_TMP,
    ...network,
    // The root bubblewrap builds and its /dev are tmpfs too, writable by the sandbox's user:
    // read-only once every mount point is made (their own mounts, /tmp, /dev/shm, the sandbox's
    // folders, stay writable; the devices still work).
    "--remount-ro", "/dev",
    "--remount-ro", "/",
    "--chdir", INSIDE_WORKDIR,
    "--",
    ...program,
  ];
}
