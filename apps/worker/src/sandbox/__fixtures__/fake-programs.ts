import path from "node:path";

/**
 * The programs a recorded sandbox "runs": the fake Docker engine and the fake API server answer
 * an exec by looking its argv[0] up here, against an in-memory container filesystem. No real
 * container, no real process.
 */

export interface FakeContainer {
  /** Absolute path → file content; directories map to null. */
  fs: Map<string, string | null>;
  /** Kill switches of the execs running now (and what they "started"). */
  running: Set<() => void>;
  /** Every exec that ran: argv and environment, in order. */
  execs: Array<{ argv: string[]; env: Record<string, string>; cwd: string }>;
  /** Paths that are FIFOs (`mkfifo`): reading one blocks until something writes, which nothing does here. */
  fifos: Set<string>;
}

export function newContainer(): FakeContainer {
  return { fs: new Map(), running: new Set(), execs: [], fifos: new Set() };
}

export interface Proc {
  argv: string[];
  env: Record<string, string>;
  cwd: string;
  c: FakeContainer;
  out: (s: string) => void;
  err: (s: string) => void;
  /** Resolves when the sandbox kills this exec. */
  killed: Promise<void>;
}

const delay = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** exit code, or "killed" when the sandbox killed it first. */
export type ProgramResult = number | "killed";

export const PROGRAMS: Record<string, (p: Proc) => Promise<ProgramResult>> = {
  true: async () => 0,
  false: async () => 1,
  echo: async (p) => {
    p.out(p.argv.slice(1).join(" ") + "\n");
    return 0;
  },
  /** Prints the environment as JSON. */
  printenv: async (p) => {
    p.out(JSON.stringify(p.env) + "\n");
    return 0;
  },
  /** write <rel> <content>: a file in the working directory. */
  write: async (p) => {
    p.c.fs.set(path.posix.resolve(p.cwd, p.argv[1]!), p.argv[2] ?? "");
    return 0;
  },
  cat: async (p) => {
    const file = p.argv[p.argv.length - 1]!;
    // As the real cat: opening a FIFO waits for a writer, here until the exec is killed.
    if (p.c.fifos.has(file)) return p.killed.then(() => "killed" as const);
    const content = p.c.fs.get(file);
    if (typeof content !== "string") {
      p.err(`cat: ${file}: No such file or directory\n`);
      return 1;
    }
    p.out(content);
    return 0;
  },
  /** rm [-rf] [--] <path>...: removes them (absent ones too, as -f). */
  rm: async (p) => {
    for (const a of p.argv.slice(1).filter((x) => !x.startsWith("-"))) {
      const target = path.posix.resolve(p.cwd, a);
      for (const k of [...p.c.fs.keys()]) if (k === target || k.startsWith(`${target}/`)) p.c.fs.delete(k);
    }
    return 0;
  },
  /** mkfifo <rel>: a FIFO in the working directory. */
  mkfifo: async (p) => {
    const file = path.posix.resolve(p.cwd, p.argv[1]!);
    p.c.fs.delete(file);
    p.c.fifos.add(file);
    return 0;
  },
  /** fill <rel> <bytes>: a file of that many bytes (an agent's `truncate -s`). */
  fill: async (p) => {
    p.c.fs.set(path.posix.resolve(p.cwd, p.argv[1]!), "x".repeat(Number(p.argv[2])));
    return 0;
  },
  /** Both streams, then exit 3. */
  noisy: async (p) => {
    p.out("to stdout\n");
    p.err("to stderr\n");
    p.out("more stdout\n");
    return 3;
  },
  /**
   * daemon <rel> <content>: exits 0 at once, leaving a background process that writes the file
   * every few ms until the container is killed (an agent's `nohup sh -c 'while …' &`).
   */
  daemon: async (p) => {
    const file = path.posix.resolve(p.cwd, p.argv[1]!);
    const content = p.argv[2] ?? "";
    const timer = setInterval(() => p.c.fs.set(file, content), 5);
    const stop = (): void => {
      clearInterval(timer);
      p.c.running.delete(stop);
    };
    p.c.running.add(stop);
    return 0;
  },
  /** sleep <seconds>: also "starts a child" that only a kill of the sandbox stops. */
  sleep: async (p) => {
    p.out("sleeping\n");
    const s = Number(p.argv[1] ?? "1");
    const r = await Promise.race([delay(s * 1000).then(() => 0 as const), p.killed.then(() => "killed" as const)]);
    return r;
  },
};

/** Runs argv[0] from PROGRAMS; null when there is no such program. */
export async function runProgram(p: Omit<Proc, "killed">): Promise<ProgramResult | null> {
  const prog = PROGRAMS[p.argv[0] ?? ""];
  if (!prog) return null;
  let kill: () => void = () => undefined;
  const killed = new Promise<void>((r) => (kill = r));
  p.c.running.add(kill);
  p.c.execs.push({ argv: p.argv, env: p.env, cwd: p.cwd });
  try {
    return await prog({ ...p, killed });
  } finally {
    p.c.running.delete(kill);
  }
}

export function killAll(c: FakeContainer): number {
  const n = c.running.size;
  for (const k of [...c.running]) k();
  return n;
}
