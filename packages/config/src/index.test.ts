import { describe, expect, it } from "vitest";
import { z } from "zod";
import { KeyPrefix, Port, RedisUrl, parseEnv } from "./index.js";

const Env = z.object({ PORT: Port.default(8080), REDIS_URL: RedisUrl, ROLLGATE_KEY_PREFIX: KeyPrefix });

describe("parseEnv", () => {
  it("fills defaults and coerces", () => {
    expect(parseEnv(Env, { PORT: "9000" })).toEqual({ PORT: 9000, REDIS_URL: "redis://127.0.0.1:6379", ROLLGATE_KEY_PREFIX: "rg" });
    expect(parseEnv(Env, { REDIS_URL: "redis+cluster://10.0.0.1:7000,10.0.0.2:7001" }).REDIS_URL).toContain("cluster");
  });

  it("throws one error naming every bad variable, never a silent default", () => {
    let message = "";
    try {
      parseEnv(Env, { PORT: "eighty", REDIS_URL: "localhost:6379", ROLLGATE_KEY_PREFIX: "a:b" });
    } catch (err) {
      message = (err as Error).message;
    }
    expect(message).toMatch(/^invalid environment:/);
    expect(message).toMatch(/PORT: /);
    expect(message).toMatch(/REDIS_URL: must be redis:\/\//);
    expect(message).toMatch(/ROLLGATE_KEY_PREFIX: letters, digits/);
  });
});
