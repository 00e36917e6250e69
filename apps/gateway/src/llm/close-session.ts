import type { GatewayContext } from "../context.js";

/**
 * Closes a session the way its close route does, for a session whose own closer is gone (the
 * attempt of a task cancelled while no worker ran it): held lost-call marks written first, then
 * closed, then its calls still being recorded waited for (those that never come are marked lost),
 * so its records and trajectory are final. False when there is no such session. Idempotent.
 */
export async function closeSessionSettled(ctx: GatewayContext, id: string, now = new Date()): Promise<boolean> {
  await ctx.lostCalls.flush(id);
  const found = await ctx.sessions.closeAndGet(id, now);
  if (!found) return false;
  try {
    await ctx.caller.pending.atClose(id, found.pendingCalls);
  } finally {
    await found.released;
  }
  return true;
}
