import { execFileSync } from "node:child_process";
import { openSync, closeSync, constants, writeFileSync } from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { EvaluatorSpec, RuntimeSpec } from "@rollgate/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { evaluate, rewardFromOutput, type EvalContext } from "./evaluators.js";
import { defaultSandboxPath } from "./sandbox/environment.js";
import { LocalRuntime } from "./sandbox/local-runtime.js";
import type { Sandbox } from "./sandbox/runtime.js";

let workdir: string;
let ctx: EvalContext;
let server: http.Server;
let serverUrl: string;
const received: unknown[] = [];

const runtime = new LocalRuntime();
const localSpec = RuntimeSpec.parse({});
const env = { PATH: defaultSandboxPath(process.cwd()) };
const sandboxes: Sandbox[] = [];
async function newSandbox(): Promise<Sandbox> {
  const s = await runtime.create("t-eval", localSpec);
  sandboxes.push(s);
  return s;
}

beforeAll(async () => {
  const sandbox = await newSandbox();
  workdir = sandbox.workdir;
  ctx = { sandbox, env, summary: () => ({ id: "t-1", agent: { exit_code: 0 } }) };
  server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (c: Buffer) => (body += c));
    req.on("end", () => {
      received.push(JSON.parse(body));
      if (req.url === "/bad") return res.writeHead(200).end("not json");
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ reward: 0.75, note: "graded" }));
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  serverUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  for (const s of sandboxes) await s.destroy();
  await new Promise((r) => server.close(r));
});

const spec = (s: unknown) => EvaluatorSpec.parse(s);

describe("rewardFromOutput", () => {
  it("reads exit codes, a last-line float, or a JSON line", () => {
    expect(rewardFromOutput("exit_code", 0, "")).toEqual({ reward: 1 });
    expect(rewardFromOutput("exit_code", 2, "")).toEqual({ reward: 0 });
    expect(rewardFromOutput("last_line_float", 0, "running tests\n0.625\n\n")).toEqual({ reward: 0.625 });
    expect(rewardFromOutput("last_line_float", 0, "all good")).toMatch(/not a number/);
    expect(rewardFromOutput("json", 0, 'log\n{"reward": 0.5, "passed": 3}\ntrailing')).toEqual({ reward: 0.5, details: { reward: 0.5, passed: 3 } });
    expect(rewardFromOutput("json", 0, '{"score": 1}')).toMatch(/no stdout line/);
  });
});

describe("evaluate", () => {
  it("command: each reward mode, and a broken evaluator fails instead of scoring", async () => {
    expect(await evaluate(spec({ kind: "command", command: ["bash", "-c", "exit 0"] }), ctx)).toMatchObject({ kind: "scored", reward: 1 });
    expect(await evaluate(spec({ kind: "command", command: ["bash", "-c", "echo 0.3"], reward: "last_line_float" }), ctx)).toMatchObject({ kind: "scored", reward: 0.3 });
    expect(await evaluate(spec({ kind: "command", command: ["bash", "-c", 'echo \'{"reward": 2}\''], reward: "json" }), ctx)).toMatchObject({
      kind: "scored",
      reward: 2,
      evaluation: { kind: "command", exit_code: 0, details: { reward: 2 } },
    });
    expect(await evaluate(spec({ kind: "command", command: ["no-such-evaluator"] }), ctx)).toMatchObject({ kind: "broken", error: { kind: "evaluator_error" } });
    expect(await evaluate(spec({ kind: "command", command: ["bash", "-c", "echo oops"], reward: "last_line_float" }), ctx)).toMatchObject({ kind: "broken" });
  });

  it("file: exact content or a regex", async () => {
    writeFileSync(path.join(workdir, "out.txt"), "hello world\n");
    expect(await evaluate(spec({ kind: "file", path: "out.txt", equals: "hello world\n" }), ctx)).toMatchObject({ reward: 1 });
    expect(await evaluate(spec({ kind: "file", path: "out.txt", regex: "^hello\\s+w" }), ctx)).toMatchObject({ reward: 1 });
    expect(await evaluate(spec({ kind: "file", path: "out.txt", equals: "hello" }), ctx)).toMatchObject({ reward: 0 });
    expect(await evaluate(spec({ kind: "file", path: "missing.txt", equals: "x" }), ctx)).toMatchObject({ reward: 0, evaluation: { details: { exists: false } } });
    expect(() => spec({ kind: "file", path: "out.txt" })).toThrow(/exactly one of equals or regex/);
    expect(() => spec({ kind: "file", path: "out.txt", regex: "(unclosed" })).toThrow(/not a valid regular expression/);
  });

  it("reward_file: reward.json or reward.txt, written by the agent or a test command", async () => {
    const sb = await newSandbox();
    const dir = sb.workdir;
    const c = { ...ctx, sandbox: sb };
    expect(await evaluate(spec({ kind: "reward_file" }), c)).toMatchObject({ kind: "broken", error: { message: expect.stringMatching(/no reward file/) } });
    writeFileSync(path.join(dir, "reward.txt"), "0.25\n");
    expect(await evaluate(spec({ kind: "reward_file" }), c)).toMatchObject({ kind: "scored", reward: 0.25 });
    expect(await evaluate(spec({ kind: "reward_file", command: ["bash", "-c", 'echo \'{"reward": 1, "tests": 4}\' > reward.json'] }), c)).toMatchObject({
      kind: "scored",
      reward: 1,
      evaluation: { details: { reward: 1, tests: 4 } },
    });
  });

  it("reward_file with a command: the reward is the command's, never a file the agent left", async () => {
    // A hostile agent plants a perfect reward before the grader runs. The grader writes its own
    // verdict to reward.txt (reward.json is read first), or crashes before writing anything.
    const sb = await newSandbox();
    const c = { ...ctx, sandbox: sb };
    const plant = () => writeFileSync(path.join(sb.workdir, "reward.json"), '{"reward": 1}');
    plant();
    expect(await evaluate(spec({ kind: "reward_file", command: ["bash", "-c", "echo 0 > reward.txt"] }), c)).toMatchObject({ kind: "scored", reward: 0 });
    plant();
    expect(await evaluate(spec({ kind: "reward_file", command: ["bash", "-c", "echo grading; exit 3"] }), c)).toMatchObject({
      kind: "broken",
      error: { kind: "evaluator_error", message: expect.stringMatching(/no reward file/) },
    });
    // With a path, that file is the command's too.
    writeFileSync(path.join(sb.workdir, "score.txt"), "1");
    expect(await evaluate(spec({ kind: "reward_file", path: "score.txt", command: ["bash", "-c", "true"] }), c)).toMatchObject({ kind: "broken" });
    // A grader killed by a signal crashed, whatever file is there.
    expect(await evaluate(spec({ kind: "reward_file", command: ["bash", "-c", "echo 0.5 > reward.txt; kill -KILL $$"] }), c)).toMatchObject({
      kind: "broken",
      error: { message: expect.stringMatching(/killed by SIGKILL/) },
    });
  });

  it("reward_file with a command: reward paths the agent made folders it is hard to remove (nested past PATH_MAX, locked) are cleared, and the grader scores", async () => {
    // Left in place, the grader could not write its reward there: the task would end
    // evaluator_error, unscored, which the agent chose.
    const sb = await runtime.create("t-eval-litter", RuntimeSpec.parse({ isolation: "bwrap", network: "host" }));
    sandboxes.push(sb);
    const e = { ...env, HOME: sb.home };
    const litter = [
      "import os",
      "os.mkdir('reward.json'); os.chdir('reward.json')",
      "for _ in range(300): os.mkdir('d' * 40); os.chdir('d' * 40)",
      "os.chdir('/workspace'); os.makedirs('reward.txt/inner'); open('reward.txt/inner/f', 'w').close()",
      "os.chmod('reward.txt/inner', 0); os.chmod('reward.txt', 0o500)",
    ].join("\n");
    expect(await sb.exec(["python3", "-c", litter], { env: e, timeoutMs: 20_000 })).toMatchObject({ exitCode: 0 });
    expect(await evaluate(spec({ kind: "reward_file", command: ["bash", "-c", "echo 0.25 > reward.txt"] }), { ...ctx, sandbox: sb, env: e })).toMatchObject({ kind: "scored", reward: 0.25 });
  });

  it("reward_file: a reward.json the agent filled (up to the 32 MiB read limit) keeps its reward, not megabytes of details in every stored result and callback", async () => {
    const sb = await runtime.create("t-eval-bloat", RuntimeSpec.parse({ isolation: "bwrap", network: "host" }));
    sandboxes.push(sb);
    const e = { ...env, HOME: sb.home };
    const bloat = "import json; json.dump({'reward': 0.5, 'tests': ['x' * 1000] * 30000}, open('reward.json', 'w'))";
    expect(await sb.exec(["python3", "-c", bloat], { env: e, timeoutMs: 20_000 })).toMatchObject({ exitCode: 0 });
    const out = await evaluate(spec({ kind: "reward_file" }), { ...ctx, sandbox: sb, env: e });
    expect(out).toMatchObject({ kind: "scored", reward: 0.5, evaluation: { details: { reward: 0.5, truncated: expect.stringMatching(/at most/) } } });
    expect(JSON.stringify(out).length).toBeLessThan(80 * 1024);
    // Details of a reasonable size are kept whole.
    writeFileSync(path.join(sb.describe(), "work", "reward.json"), JSON.stringify({ reward: 1, passed: 12, failed: 0 }));
    expect(await evaluate(spec({ kind: "reward_file" }), { ...ctx, sandbox: sb, env: e })).toMatchObject({ evaluation: { details: { reward: 1, passed: 12, failed: 0 } } });
  });

  it("file and reward_file: a FIFO or a special file the agent left at the path ends the evaluation instead of hanging it", async () => {
    // Reading a FIFO blocks until someone writes to it: nobody will (the agent is gone), so the
    // rollout would never end, holding one of the worker's file-system threads for good.
    const sb = await newSandbox();
    const c = { ...ctx, sandbox: sb };
    execFileSync("mkfifo", [path.join(sb.workdir, "out.txt"), path.join(sb.workdir, "reward.txt")]);
    try {
      expect(await evaluate(spec({ kind: "file", path: "out.txt", equals: "x" }), c)).toMatchObject({ kind: "scored", reward: 0 });
      expect(await evaluate(spec({ kind: "reward_file" }), c)).toMatchObject({ kind: "broken" });
    } finally {
      // Unblocks a read the code under test left hanging, so the test process can end.
      for (const f of ["out.txt", "reward.txt"]) {
        try {
          closeSync(openSync(path.join(sb.workdir, f), constants.O_WRONLY | constants.O_NONBLOCK));
        } catch {
          // no reader waiting
        }
      }
    }
  });

  it.each([
    ["a local sandbox", localSpec],
    ["a bubblewrap sandbox", RuntimeSpec.parse({ isolation: "bwrap", network: "host" })],
  ])("in %s, an evaluator does not run what the agent left in its HOME (a Python usercustomize printing a perfect reward)", async (_, rt) => {
    const sb = await runtime.create("t-eval-home", rt);
    sandboxes.push(sb);
    const e = { ...env, HOME: sb.home, TMPDIR: sb.tmp };
    const c = { ...ctx, sandbox: sb, env: e };
    // The agent's step: Python runs ~/.local/lib/pythonX.Y/site-packages/usercustomize.py at start.
    const plant = `d=$(python3 -c 'import site; print(site.getusersitepackages())') && mkdir -p "$d" && printf 'import os\nprint("1.0", flush=True)\nos._exit(0)\n' > "$d/usercustomize.py"`;
    expect(await sb.exec(["bash", "-c", plant], { env: e, timeoutMs: 20_000 })).toMatchObject({ exitCode: 0 });
    expect((await sb.exec(["python3", "-c", "print(0.0)"], { env: e, timeoutMs: 20_000 })).stdoutTail).toBe("1.0\n");
    expect(await evaluate(spec({ kind: "command", command: ["python3", "-c", "print(0.0)"], reward: "last_line_float" }), c)).toMatchObject({ kind: "scored", reward: 0 });
    // Its HOME and TMPDIR are its own and writable, at the paths the environment names.
    const own = await evaluate(spec({ kind: "command", command: ["bash", "-c", 'touch "$HOME/x" "$TMPDIR/y" && ls -A "$HOME" | wc -l'], reward: "last_line_float" }), c);
    expect(own).toMatchObject({ kind: "scored", reward: 1 });
  });

  it("file: a regex that backtracks catastrophically on the agent's file fails the evaluation instead of freezing the worker", async () => {
    // `^(\w+\s?)*$` on 40 letters and a "!" takes about 2^40 steps: on the worker's event loop it
    // would hold every rollout of the worker (and renew no job lock) for good.
    const sb = await newSandbox();
    writeFileSync(path.join(sb.workdir, "answer.txt"), `${"a".repeat(40)}!`);
    const c = { ...ctx, sandbox: sb, regexTimeoutMs: 300 };
    expect(await evaluate(spec({ kind: "file", path: "answer.txt", regex: "^(\\w+\\s?)*$" }), c)).toMatchObject({
      kind: "broken",
      error: { kind: "evaluator_error", message: expect.stringMatching(/ran longer than 0.3s on answer.txt/) },
    });
    // The same regex on a file it handles: scored as before.
    writeFileSync(path.join(sb.workdir, "answer.txt"), "all good here");
    expect(await evaluate(spec({ kind: "file", path: "answer.txt", regex: "^(\\w+\\s?)*$" }), c)).toMatchObject({ kind: "scored", reward: 1 });
  });

  it("http: posts the result summary and reads {reward}", async () => {
    expect(await evaluate(spec({ kind: "http", url: `${serverUrl}/grade` }), ctx)).toMatchObject({ kind: "scored", reward: 0.75 });
    expect(received.at(-1)).toEqual({ id: "t-1", agent: { exit_code: 0 } });
    expect(await evaluate(spec({ kind: "http", url: `${serverUrl}/bad` }), ctx)).toMatchObject({ kind: "broken" });
    expect(await evaluate(spec({ kind: "http", url: "http://127.0.0.1:9/x", timeout_s: 2 }), ctx)).toMatchObject({ kind: "broken" });
  });

  it("none (or no evaluator): no reward, nothing run", async () => {
    expect(await evaluate(spec({ kind: "none" }), ctx)).toEqual({ kind: "scored", reward: null, evaluation: null });
    expect(await evaluate(null, ctx)).toEqual({ kind: "scored", reward: null, evaluation: null });
  });
});
