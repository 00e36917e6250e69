import { createCipheriv, createDecipheriv, createHash, createHmac } from "node:crypto";
import { secretsEqual } from "@rollgate/protocol";

/**
 * Reasoning the gateway hands to an agent and must get back intact: Anthropic `thinking` blocks
 * carry a `signature`, OpenAI Responses `reasoning` items an `encrypted_content`. Both are keyed
 * by a per-session secret (the session's token hash), so any gateway replica can check them and
 * no other session can forge one. Deterministic (the IV is derived from the content), so these
 * stay pure functions.
 */

function keyBytes(key: string, purpose: string): Buffer {
  return createHash("sha256").update(`rollgate:${purpose}:${key}`).digest();
}

/** `signature` for an Anthropic thinking block: HMAC-SHA256 of the text, base64url. */
export function signReasoning(key: string, text: string): string {
  return createHmac("sha256", keyBytes(key, "sign")).update(text).digest("base64url");
}

export function verifyReasoning(key: string, text: string, signature: string): boolean {
  return secretsEqual(signReasoning(key, text), signature);
}

/** `encrypted_content` for a Responses reasoning item: AES-256-GCM, iv‖tag‖ciphertext, base64url. */
export function sealReasoning(key: string, text: string): string {
  const k = keyBytes(key, "seal");
  const iv = createHmac("sha256", k).update(text).digest().subarray(0, 12);
  const cipher = createCipheriv("aes-256-gcm", k, iv);
  const body = Buffer.concat([cipher.update(text, "utf8"), cipher.final()]);
  return Buffer.concat([iv, cipher.getAuthTag(), body]).toString("base64url");
}

/** The reasoning sealed by `sealReasoning` with the same key, or null if it was not (or was altered). */
export function openReasoning(key: string, sealed: string): string | null {
  try {
    const raw = Buffer.from(sealed, "base64url");
    if (raw.length < 28) return null;
    const decipher = createDecipheriv("aes-256-gcm", keyBytes(key, "seal"), raw.subarray(0, 12));
    decipher.setAuthTag(raw.subarray(12, 28));
    return Buffer.concat([decipher.update(raw.subarray(28)), decipher.final()]).toString("utf8");
  } catch {
    return null;
  }
}
