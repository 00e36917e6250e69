import { describe, expect, it } from "vitest";
import { TokenHolds, fitCall } from "./token-budget.js";

describe("fitCall", () => {
  it("an unknown prompt needs no cap while the engine's context fits in what is left; else its prompt must be known", () => {
    expect(fitCall(50_000, null, undefined, 40_960)).toEqual({ fits: true, maxTokens: undefined, hold: 40_960 });
    expect(fitCall(50_000, null, 512, 40_960)).toEqual({ fits: true, maxTokens: 512, hold: 40_960 });
    expect(fitCall(40_000, null, 512, 40_960)).toEqual({ fits: false, why: "prompt_unknown" });
    expect(fitCall(1_000_000, null, 512, null)).toEqual({ fits: false, why: "prompt_unknown" });
  });
  it("a known prompt: max_tokens is capped at what is left after it (also when none was asked), kept when it fits", () => {
    expect(fitCall(100, 30, undefined, 40_960)).toEqual({ fits: true, maxTokens: 70, hold: 100 });
    expect(fitCall(100, 30, 500, 40_960)).toEqual({ fits: true, maxTokens: 70, hold: 100 });
    expect(fitCall(100, 30, 20, 40_960)).toEqual({ fits: true, maxTokens: 20, hold: 50 });
    expect(fitCall(100_000, 30, undefined, 40_960)).toEqual({ fits: true, maxTokens: undefined, hold: 40_960 });
  });
  it("a prompt that leaves no room for one answer token does not fit", () => {
    expect(fitCall(30, 30, undefined, 40_960)).toEqual({ fits: false, why: "over" });
    expect(fitCall(10, 30, 5, 40_960)).toEqual({ fits: false, why: "over" });
  });
});

describe("TokenHolds", () => {
  it("holds add up per session; a release wakes the session's waiting calls and counts as released for a call being fitted", async () => {
    const holds = new TokenHolds();
    const fitting = holds.fitting("s");
    holds.hold("s", 0, 40);
    holds.hold("s", 1, 25);
    holds.hold("t", 0, 1000);
    expect(holds.heldByOthers("s", 1)).toBe(40);
    expect(holds.othersHold("s", 1)).toBe(true);
    const woken = holds.nextRelease("s", new AbortController().signal);
    holds.release("s", 0);
    await woken;
    expect(fitting.released()).toBe(40);
    expect(holds.othersHold("s", 1)).toBe(false);
    fitting.done();
    holds.release("s", 1);
    expect(holds.heldByOthers("s", 9)).toBe(0);
  });
});
