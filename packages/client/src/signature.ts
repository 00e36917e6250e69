import { createHmac } from "node:crypto";
import { secretsEqual } from "@rollgate/protocol";

/** `sha256=<hex HMAC-SHA256(body, secret)>`: the `X-Rollgate-Signature` of a callback body. */
export function signBody(body: string | Buffer, secret: string): string {
  return `sha256=${createHmac("sha256", secret).update(body).digest("hex")}`;
}

/**
 * Checks a callback's `X-Rollgate-Signature` against the raw body bytes (never a re-serialised
 * JSON object: the signature is over exactly what was sent). Constant-time.
 */
export function verifySignature(body: string | Buffer, signature: string | string[] | undefined | null, secret: string): boolean {
  const given = Array.isArray(signature) ? signature[0] : signature;
  if (!given || !given.startsWith("sha256=")) return false;
  return secretsEqual(signBody(body, secret), given.trim());
}
