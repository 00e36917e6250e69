import { timingSafeEqual } from "node:crypto";

/**
 * Whether two secrets (keys, tokens, token hashes, signatures) are equal, compared in constant
 * time: `timingSafeEqual` on equal-length bytes, never `===`. Strings are compared as their UTF-8
 * bytes. The one home of this check: every package that verifies a secret depends on the protocol.
 */
export function secretsEqual(a: string | Uint8Array, b: string | Uint8Array): boolean {
  const x = typeof a === "string" ? Buffer.from(a) : a;
  const y = typeof b === "string" ? Buffer.from(b) : b;
  return x.length === y.length && timingSafeEqual(x, y);
}
