import { describe, expect, it } from "vitest";
import { openReasoning, sealReasoning, signReasoning, verifyReasoning } from "./reasoning-seal.js";

describe("reasoning seals", () => {
  it("signs thinking so only the same session key verifies it", () => {
    const sig = signReasoning("key-a", "I should list files.");
    expect(verifyReasoning("key-a", "I should list files.", sig)).toBe(true);
    expect(verifyReasoning("key-a", "I should delete files.", sig)).toBe(false);
    expect(verifyReasoning("key-b", "I should list files.", sig)).toBe(false);
  });
  it("seals reasoning for Responses replay and refuses tampered or foreign content", () => {
    const sealed = sealReasoning("key-a", "ünïcode reasoning ✓");
    expect(sealed).toBe(sealReasoning("key-a", "ünïcode reasoning ✓"));
    expect(openReasoning("key-a", sealed)).toBe("ünïcode reasoning ✓");
    expect(openReasoning("key-b", sealed)).toBeNull();
    const tampered = Buffer.from(sealed, "base64url");
    tampered[tampered.length - 1]! ^= 1;
    expect(openReasoning("key-a", tampered.toString("base64url"))).toBeNull();
    expect(openReasoning("key-a", "garbage")).toBeNull();
  });
});
