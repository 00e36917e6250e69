import { createHmac } from "node:crypto";

/** `X-Rollgate-Signature`: `sha256=<hex HMAC-SHA256 of the raw body with callback.secret>` (docs/http-api.md#callbacks). */
export function signBody(rawBody: string, secret: string): string {
  return `sha256=${createHmac("sha256", secret).update(rawBody).digest("hex")}`;
}
