import { describe, expect, it } from "vitest";
import { lostCallsOf } from "./rollout.js";

const none = { count: 0, first: null };
const gateway = { count: 1, first: { at: "2026-01-01T00:00:05.000Z", kind: "engine_unreachable", status: 502, message: "engine down" } };
const relay = { count: 2, first: { at: "2026-01-01T00:00:01.000Z", kind: "relay_unreachable", status: 502, message: "relay could not reach the gateway" } };

describe("lostCallsOf", () => {
  it("is null when neither the session nor the sandbox's relay lost a call (the rollout is scored)", () => {
    expect(lostCallsOf(none, none)).toBeNull();
  });

  it("counts the relay's undelivered calls, which the session never saw, and names the earliest cause", () => {
    expect(lostCallsOf(none, relay)).toEqual(relay);
    expect(lostCallsOf(gateway, none)).toEqual(gateway);
    expect(lostCallsOf(gateway, relay)).toEqual({ count: 3, first: relay.first });
  });
});
