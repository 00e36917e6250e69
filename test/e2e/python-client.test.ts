/**
 * The Python client as a trainer gets it: `clients/python` installed offline into a fresh venv
 * (pip + the venv's old setuptools, no `wheel`: the package's own stdlib build backend), then
 * `examples/python/train_loop.py` for two GRPO steps against a real cluster (groups, signed
 * callbacks, advantages, step arrays, pause → weights loaded on every engine → resume), and the
 * package's callback suite (signature refusal, redelivery dedup) with the installed package.
 */
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { REPO_ROOT, startCluster, type RunningCluster } from "../support/cluster.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";

const python = spawnSync("python3", ["-c", "import venv, ensurepip"], { encoding: "utf8" });
const skip = python.error ? "python3 is not installed" : python.status !== 0 ? `python3 cannot make a venv with pip (${python.stderr.trim().split("\n").at(-1)}); install python3-venv` : null;
if (skip) console.warn(`[python-client.test] SKIPPED: ${skip}`);

/** What `train_loop.py --json` prints. */
interface LoopSummary {
  ok: boolean;
  versions: string[];
  steps: {
    version: string;
    sampled_by: string[];
    groups: { rewards: (number | null)[]; advantages: (number | null)[] }[];
    samples: number;
    trainable_tokens: number;
    mean_old_logprob: number | null;
    loaded: { version: string; engines: { kind: string; ok: boolean; ranks_loaded: number[] }[] };
  }[];
}

describe.skipIf(skip !== null)("the rollgate Python package", () => {
  const prefix = uniquePrefix("pyclient");
  const apiKey = "py-key";
  const tmp = mkdtempSync(path.join(os.tmpdir(), "rollgate-py-"));
  const venvPython = path.join(tmp, "venv", "bin", "python");
  let cluster: RunningCluster;
  const env = () => ({ ...process.env, ROLLGATE_URL: cluster.url, ROLLGATE_API_KEY: apiKey, PIP_DISABLE_PIP_VERSION_CHECK: "1", PYTHONPATH: "" });

  beforeAll(async () => {
    cluster = await startCluster({ ROLLGATE_KEY_PREFIX: prefix, ROLLGATE_API_KEY: apiKey, ROLLGATE_CALLBACK_BACKOFF_MS: "200" });
  }, 90_000);
  afterAll(async () => {
    await cluster?.stop();
    await dropPrefix(prefix);
    rmSync(tmp, { recursive: true, force: true });
  });

  it("installs offline into a fresh venv with pip --no-index --no-build-isolation", () => {
    expect(spawnSync("python3", ["-m", "venv", path.join(tmp, "venv")], { encoding: "utf8" }).status).toBe(0);
    const noWheel = spawnSync(venvPython, ["-c", "import wheel"], { encoding: "utf8" });
    expect(noWheel.status, "a fresh venv should not have `wheel`: the test would not show the offline build").not.toBe(0);
    const pip = spawnSync(venvPython, ["-m", "pip", "install", "--no-index", "--no-build-isolation", path.join(REPO_ROOT, "clients/python")], { encoding: "utf8", env: env(), timeout: 120_000 });
    expect(pip.status, pip.stdout + pip.stderr).toBe(0);
    const shown = spawnSync(venvPython, ["-c", "import rollgate, json; print(json.dumps([rollgate.__version__, rollgate.__file__]))"], { encoding: "utf8", cwd: tmp, env: env() });
    expect(shown.status, shown.stderr).toBe(0);
    const [version, file] = JSON.parse(shown.stdout) as [string, string];
    expect(version).toBe("0.1.0");
    expect(file.startsWith(path.join(tmp, "venv"))).toBe(true);
  }, 150_000);

  it("runs the example training loop: rewards, advantages, and each step's tokens on that step's weights", () => {
    const res = spawnSync(venvPython, [path.join(REPO_ROOT, "examples/python/train_loop.py"), "--steps", "2", "--group-size", "3", "--prompts", "2", "--json"], {
      encoding: "utf8",
      env: env(),
      timeout: 240_000,
    });
    expect(res.status, `${res.stderr}\n${cluster.output()}`).toBe(0);
    expect(res.stderr).toContain("rewards [");
    expect(res.stderr).toContain("→ advantages [");
    const summary = JSON.parse(res.stdout.trim().split("\n").at(-1)!) as LoopSummary;
    expect(summary.ok).toBe(true);
    expect(summary.versions).toHaveLength(3);
    expect(summary.steps).toHaveLength(2);
    summary.steps.forEach((step, k) => {
      expect(step.version).toBe(summary.versions[k]);
      expect(step.sampled_by).toEqual([summary.versions[k]]);
      expect(step.groups).toHaveLength(2);
      for (const g of step.groups) {
        expect(g.rewards).toHaveLength(3);
        expect(g.advantages).toHaveLength(3);
        expect(g.rewards.every((r) => typeof r === "number")).toBe(true);
      }
      expect(step.samples).toBe(6);
      expect(step.trainable_tokens).toBeGreaterThan(0);
      expect(step.loaded.version).toBe(summary.versions[k + 1]);
      expect(step.loaded.engines).toEqual([{ kind: "vllm", ok: true, ranks_loaded: [0, 1] }]);
    });
    // New weights, new logprobs (engine-sim's logprobs are a function of the weight version).
    expect(summary.steps[0]!.mean_old_logprob).not.toBe(summary.steps[1]!.mean_old_logprob);
  }, 240_000);

  it("the installed package's callback suite passes: signed deliveries only, a redelivery counted once", () => {
    const res = spawnSync(venvPython, ["-m", "unittest", "-v", "test_callbacks"], { encoding: "utf8", cwd: path.join(REPO_ROOT, "clients/python/tests"), env: env(), timeout: 180_000 });
    expect(res.status, res.stderr).toBe(0);
    // Every test of the file ran (a fixed count went stale as the suite grew), none skipped.
    const defined = readFileSync(path.join(REPO_ROOT, "clients/python/tests/test_callbacks.py"), "utf8").match(/^ {4}def test_/gm)?.length;
    expect(res.stderr).toContain(`Ran ${defined} tests`);
    expect(res.stderr).not.toContain("skipped");
  }, 180_000);
});
