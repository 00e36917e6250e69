import { createHmac } from "node:crypto";
import { describe, expect, it } from "vitest";
import { signBody } from "./signing.js";

describe("signBody", () => {
  it("is sha256=<hex HMAC-SHA256 of the raw body>, which a trainer can verify with its secret", () => {
    const body = '{"id":"t-1","status":"completed"}';
    expect(signBody(body, "s3cret")).toBe(`sha256=${createHmac("sha256", "s3cret").update(body).digest("hex")}`);
    expect(signBody(body, "s3cret")).not.toBe(signBody(body + " ", "s3cret"));
  });
});
