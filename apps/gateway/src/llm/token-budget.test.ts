import { FIT_CALL_LUA } from "@rollgate/store";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TEST_REDIS_URL } from "../__fixtures__/harness.js";
import { HoldReleases, fitCall, type BudgetFit } from "./token-budget.js";

/**
 * One table of cases for both fits: the gateway's `fitCall` and the Lua one the store's hold script
 * runs on Redis (store token-holds.ts), so they cannot drift. [left, prompt length, asked, context length] -> fit.
 */
const CASES: { why: string; args: [number, number | null, number | undefined, number | null]; fit: BudgetFit }[] = [
  // An unknown prompt needs no cap while the engine's context fits in what is left; else its prompt must be known.
  { why: "unknown prompt, context fits, none asked", args: [50_000, null, undefined, 40_960], fit: { fits: true, maxTokens: undefined, hold: 40_960 } },
  { why: "unknown prompt, context fits, asked kept", args: [50_000, null, 512, 40_960], fit: { fits: true, maxTokens: 512, hold: 40_960 } },
  { why: "unknown prompt, context fits exactly", args: [40_960, null, 512, 40_960], fit: { fits: true, maxTokens: 512, hold: 40_960 } },
  { why: "unknown prompt, context does not fit", args: [40_000, null, 512, 40_960], fit: { fits: false, why: "prompt_unknown" } },
  { why: "unknown prompt, unknown context", args: [1_000_000, null, 512, null], fit: { fits: false, why: "prompt_unknown" } },
  // A known prompt: max_tokens is capped at what is left after it (also when none was asked), kept when it fits.
  { why: "none asked, capped", args: [100, 30, undefined, 40_960], fit: { fits: true, maxTokens: 70, hold: 100 } },
  { why: "asked more than left, capped", args: [100, 30, 500, 40_960], fit: { fits: true, maxTokens: 70, hold: 100 } },
  { why: "asked fits, kept", args: [100, 30, 20, 40_960], fit: { fits: true, maxTokens: 20, hold: 50 } },
  { why: "asked fits exactly, kept", args: [100, 30, 70, 40_960], fit: { fits: true, maxTokens: 70, hold: 100 } },
  { why: "none asked, context fits, uncapped", args: [100_000, 30, undefined, 40_960], fit: { fits: true, maxTokens: undefined, hold: 40_960 } },
  { why: "none asked, unknown context, capped", args: [100, 30, undefined, null], fit: { fits: true, maxTokens: 70, hold: 100 } },
  { why: "prompt not counted (no render), capped", args: [100, 0, undefined, 40_960], fit: { fits: true, maxTokens: 100, hold: 100 } },
  // A prompt that leaves no room for one answer token does not fit.
  { why: "prompt fills what is left", args: [30, 30, undefined, 40_960], fit: { fits: false, why: "over" } },
  { why: "prompt over what is left", args: [10, 30, 5, 40_960], fit: { fits: false, why: "over" } },
  { why: "nothing left (others hold more than is left)", args: [-20, 30, 5, 40_960], fit: { fits: false, why: "over" } },
  { why: "one answer token left", args: [31, 30, 5, 40_960], fit: { fits: true, maxTokens: 1, hold: 31 } },
];

describe("fitCall", () => {
  for (const c of CASES) it(c.why, () => expect(fitCall(...c.args)).toEqual(c.fit));
});

describe("fitCall in Lua (the store's hold script)", () => {
  let redis: Redis;
  beforeAll(() => {
    redis = new Redis(TEST_REDIS_URL);
  });
  afterAll(() => redis?.disconnect());
  // Lua's answer as fitCall's: [1, max_tokens or -1, hold] | [0, why]. No key is touched.
  const lua = `${FIT_CALL_LUA}
local fits, a, b = fit_call(tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]))
if fits then return {1, a or -1, b} end
return {0, a}`;
  const opt = (n: number | null | undefined) => (n === null || n === undefined ? "" : String(n));
  for (const c of CASES) {
    it(c.why, async () => {
      const [fits, a, b] = (await redis.eval(lua, 0, ...c.args.map(opt))) as [number, number | string, number?];
      const got: BudgetFit = fits === 1 ? { fits: true, maxTokens: a === -1 ? undefined : Number(a), hold: Number(b) } : { fits: false, why: a as "over" | "prompt_unknown" };
      expect(got).toEqual(c.fit);
    });
  }
});

describe("HoldReleases", () => {
  it("a release wakes the session's waiting calls, not another session's; a wait ends after its bound or on abort", async () => {
    const releases = new HoldReleases();
    const never = new AbortController().signal;
    let other = false;
    void releases.next("t", never, 60_000).then(() => (other = true));
    const woken = releases.next("s", never, 60_000);
    releases.released("s");
    await woken;
    expect(other).toBe(false);
    await releases.next("t", never, 1);
    const aborting = new AbortController();
    const aborted = releases.next("u", aborting.signal, 60_000);
    aborting.abort();
    await aborted;
    releases.released("t");
    await Promise.resolve();
    expect(other).toBe(true);
  });
});
