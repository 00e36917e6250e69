import type { CanonicalChatRequest, CompletionRecord } from "@rollgate/protocol";
import { describe, expect, it } from "vitest";
import { replayDifference } from "./replay.js";

const request = (system: string) => ({ messages: [{ role: "system", content: system }, { role: "user", content: "go" }] }) as unknown as CompletionRecord["request"] & CanonicalChatRequest;

describe("replayDifference", () => {
  it("is null for the same request, whatever the key order", () => {
    const a = request("You are a CLI.");
    const b = { messages: a.messages.map((m) => Object.fromEntries(Object.entries(m).reverse())) } as unknown as CanonicalChatRequest;
    expect(replayDifference(a, b)).toBeNull();
  });

  it("names a long message's difference where it is, not its first characters", () => {
    const long = "You are a CLI. ".repeat(200);
    const d = replayDifference(request(`${long}Today's date is 2026-11-26.`), request(`${long}Today's date is 2026-11-27.`));
    expect(d).toMatch(/^message 0 differs: recorded \.\.\..*Today's date is 2026-11-26\..*, asked \.\.\..*Today's date is 2026-11-27\./);
    expect(d!.length).toBeLessThan(500);
  });
});
