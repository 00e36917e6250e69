import type { LostCalls, RuntimeSpec } from "@rollgate/protocol";
import type { RunResult } from "./process.js";

/** A sandbox whose calls all reached the gateway (or that has no relay of its own). */
export const NO_LOST_CALLS: LostCalls = Object.freeze({ count: 0, first: null });

export interface ExecOptions {
  env: Record<string, string>;
  timeoutMs: number;
  signal?: AbortSignal;
  onOutput?: (chunk: Buffer) => void;
  /**
   * Run with an empty HOME and TMPDIR of the step's own (same paths), not the ones the agent
   * wrote: what the agent left there (a Python usercustomize or .pth file, a .gitconfig) cannot run
   * inside an evaluator. The `local` runtime (with or without bubblewrap) honours it; in a
   * container the agent owns the whole file system and it changes nothing.
   */
  freshHome?: boolean;
  /**
   * An evaluator's step: a bubblewrap sandbox also sees ROLLGATE_EVALUATOR_BINDS (hidden tests,
   * expected answers), which the agent's own steps never see. Other runtimes ignore it.
   */
  evaluator?: boolean;
}

/**
 * One rollout's sandbox, wherever it runs (a local folder, a container, a pod): the same
 * prepare / harness / evaluator steps go through `exec`, and evaluators read results with
 * `readFile`, so the rollout logic never knows which runtime it is on.
 */
export interface Sandbox {
  /** The working directory as the sandboxed programs see it. */
  readonly workdir: string;
  /** HOME and TMPDIR as the sandboxed programs see them. */
  readonly home: string;
  readonly tmp: string;
  /**
   * The session's URL as the agent must use it when the runtime put a relay in between (a
   * sealed network); null when the agent uses the gateway's own session URL.
   */
  readonly sessionUrl: string | null;
  exec(argv: string[], opts: ExecOptions): Promise<RunResult>;
  /** Writes files relative to HOME (harness config files). */
  writeHomeFiles(files: Record<string, string>): Promise<void>;
  /** A file of the working directory, or null when it does not exist. */
  readFile(relPath: string): Promise<string | null>;
  /**
   * Removes a path of the working directory if it exists (whatever it is; a link itself, not its
   * target): a `reward_file` evaluator clears the reward files before its command runs, so the
   * reward it reads is the command's and never one the agent left.
   */
  removeFile(relPath: string): Promise<void>;
  /**
   * Kills whatever the steps so far left running (an agent's daemon), before the evaluator runs,
   * so nothing of the agent's can rewrite what the evaluator reads. Runtimes whose steps cannot
   * leave anything behind (bubblewrap: its PID namespace ends with the step) need not do anything.
   */
  stopLeftovers?(): Promise<void>;
  /**
   * Which of the sandbox's caps are reached now (its folders full of bytes or of files), for the
   * rollout's outcome: what the agent ran into is told, not only its exit code. Runtimes without
   * such caps need not answer.
   */
  limitsReached?(): Promise<("disk" | "inodes")[]>;
  /** Removes everything (unless the task asked to keep it); always safe to call. */
  destroy(): Promise<void>;
  /** Where a kept sandbox can be found, for the logs. */
  describe(): string;
  /**
   * Agent calls the sandbox's own relay could not deliver to the gateway (a sealed network), so
   * the gateway never saw them: lost to infrastructure like the ones the session records.
   */
  lostCalls(): LostCalls;
}

/** What a runtime may be told about the rollout when it creates the sandbox. */
export interface CreateOptions {
  /**
   * The rollout's gateway session (its id and `base_url`): a sealed sandbox's relay lets the
   * agent reach this session's routes and nothing else.
   */
  session?: { id: string; url: string };
  /**
   * The gateway session token. The `kubernetes` runtime puts it in the pod's own Secret; when it is
   * not given here, the pod is created at the first exec and the token is taken from that step's
   * environment (the key variables of docs/agent-environment.md#environment-variables). Other runtimes ignore it.
   */
  sessionToken?: string;
  /** The rollout's time limit (`limits.timeout_s`): a pod outlives it by a margin at most (activeDeadlineSeconds). */
  timeoutS?: number;
}

export interface SandboxRuntime {
  create(taskId: string, runtime: RuntimeSpec, opts?: CreateOptions): Promise<Sandbox>;
  /** Removes sandboxes this worker left behind when it died (container runtimes); resolves to how many. */
  sweep?(): Promise<number>;
}
