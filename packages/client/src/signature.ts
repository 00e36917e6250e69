import { createHmac } from "node:crypto";
import { secretsEqual } from "@rollgate/protocol";

/** How far a delivery's `X-Rollgate-Timestamp` may be from the receiver's clock, by default: 5 minutes. */
export const DEFAULT_SIGNATURE_TOLERANCE_SECONDS = 300;

/** What the `X-Rollgate-Signature-V2` of a callback covers. */
export interface SignedDelivery {
  /** `X-Rollgate-Delivery`. */
  deliveryId: string;
  /** `X-Rollgate-Event`. */
  event: string;
  /** `X-Rollgate-Timestamp`: Unix seconds when this attempt was sent. */
  timestamp: number | string;
  /** The raw body bytes. */
  body: string | Buffer;
}

/**
 * `v2,<base64 HMAC-SHA256(secret, "<delivery id>.<timestamp>.<event>.<body>")>`: the
 * `X-Rollgate-Signature-V2` of a callback (Standard Webhooks' `id.timestamp.body` with the event
 * added, so neither a fresh delivery id, another event nor an old timestamp keeps it valid).
 */
export function signDelivery(d: SignedDelivery, secret: string): string {
  const mac = createHmac("sha256", secret).update(`${d.deliveryId}.${d.timestamp}.${d.event}.`).update(d.body);
  return `v2,${mac.digest("base64")}`;
}

type Header = string | string[] | undefined | null;

/** The request's headers by lower-case name (Node's `req.headers`): `x-rollgate-delivery`, `-event`, `-timestamp`, `-signature-v2`. */
export type VerifyDeliveryHeaders = Readonly<Record<string, Header>>;

/** Why a delivery was refused, or null when it is authentic and fresh. */
export type DeliveryRefusal = "missing signature" | "bad signature" | "bad timestamp" | "stale timestamp" | null;

const one = (h: Header): string => (Array.isArray(h) ? h.join(" ") : (h ?? "")).trim();
// Rollgate's events are `task.<status>` and `group.completed`: never a `{`, so the event cannot be
// shifted into the body (which is a JSON object) in the signed content, nor the reverse.
const EVENT = /^[a-z]+(\.[a-z_]+)*$/;

/**
 * Checks a callback against its `X-Rollgate-Signature-V2` (any one of its space-separated `v2,`
 * entries), constant-time, over the raw body bytes as received, and that its timestamp is within
 * `toleranceSeconds` of now (either way). The body-only `X-Rollgate-Signature` is not accepted
 * instead: a delivery without the new signature is refused (no downgrade).
 */
export function verifyDelivery(
  body: string | Buffer,
  headers: VerifyDeliveryHeaders,
  secret: string,
  opts: { toleranceSeconds?: number; now?: () => number } = {},
): DeliveryRefusal {
  const signatures = one(headers["x-rollgate-signature-v2"]).split(/\s+/).filter((s) => s.startsWith("v2,"));
  const deliveryId = one(headers["x-rollgate-delivery"]);
  const event = one(headers["x-rollgate-event"]);
  const timestamp = one(headers["x-rollgate-timestamp"]);
  if (signatures.length === 0 || !deliveryId) return "missing signature";
  if (!/^[0-9]{1,15}$/.test(timestamp)) return "bad timestamp";
  if (!EVENT.test(event)) return "bad signature";
  const expected = signDelivery({ deliveryId, event, timestamp, body }, secret);
  // Every entry is compared (no early exit), each in constant time.
  let ok = false;
  for (const s of signatures) ok = secretsEqual(expected, s) || ok;
  if (!ok) return "bad signature";
  const tolerance = opts.toleranceSeconds ?? DEFAULT_SIGNATURE_TOLERANCE_SECONDS;
  const now = (opts.now ?? Date.now)() / 1000;
  if (Math.abs(now - Number(timestamp)) > tolerance) return "stale timestamp";
  return null;
}

/**
 * `sha256=<hex HMAC-SHA256(body, secret)>`: the legacy, body-only `X-Rollgate-Signature`. Workers
 * still send it beside `X-Rollgate-Signature-V2` so receivers of the previous release keep working
 * during a rolling upgrade; it does not cover the delivery id, the event nor a time.
 */
export function signBody(body: string | Buffer, secret: string): string {
  return `sha256=${createHmac("sha256", secret).update(body).digest("hex")}`;
}

/**
 * Checks the legacy body-only `X-Rollgate-Signature` (constant-time).
 * @deprecated A body that passes it can be replayed under a fresh delivery id, another event, or
 * forever: use {@link verifyDelivery}.
 */
export function verifySignature(body: string | Buffer, signature: string | string[] | undefined | null, secret: string): boolean {
  const given = Array.isArray(signature) ? signature[0] : signature;
  if (!given || !given.startsWith("sha256=")) return false;
  return secretsEqual(signBody(body, secret), given.trim());
}
