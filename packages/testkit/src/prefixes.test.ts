import { Redis } from "ioredis";
import { afterAll, describe, expect, it } from "vitest";
import { dropPrefix, uniquePrefix } from "./prefixes.js";
import { DEFAULT_REDIS_URL } from "./redis.js";

const url = process.env.REDIS_URL ?? DEFAULT_REDIS_URL;
const redis = new Redis(url);
afterAll(() => redis.disconnect());

describe("uniquePrefix / dropPrefix", () => {
  it("gives a new prefix each time, and drops its plain and hash-tagged keys, none of another's", async () => {
    const p = uniquePrefix("test", "testkit");
    const other = uniquePrefix("test", "testkit");
    expect(p).toMatch(/^test-testkit-[0-9a-f]{8}$/);
    expect(other).not.toBe(p);
    for (const key of [`${p}:a`, `{${p}:q:rollouts}:b`, `{${p}}:c`, `${other}:a`]) await redis.set(key, "1");
    try {
      expect(await dropPrefix(url, p)).toBe(3);
      for (const key of [`${p}:a`, `{${p}:q:rollouts}:b`, `{${p}}:c`]) expect(await redis.exists(key)).toBe(0);
      expect(await redis.get(`${other}:a`)).toBe("1");
    } finally {
      await dropPrefix(url, p);
      expect(await dropPrefix(url, other)).toBe(1);
    }
  });
});
