import { Readiness, type EngineReadiness } from "@rollgate/protocol";

/** One engine's state as a line a person reads; a loud WARNING, by name, when it cannot serve. */
export function engineLine(e: EngineReadiness): string {
  const name = `engine ${e.engine} (${e.kind} ${e.url})`;
  if (e.ready) return `${name}: ready · model ${e.model} · ${e.healthy_ranks}/${e.ranks} rank(s) answer`;
  return `WARNING: ${name} is NOT READY: ${e.reason}`;
}

/** What to print for a readiness answer (pure): each engine's line, and Redis's when it is the trouble. */
export function readinessLines(r: Readiness): string[] {
  return [...(r.redis === "ok" ? [] : [`WARNING: Redis does not answer: ${r.redis}`]), ...r.engines.map(engineLine)];
}

/** Asks a gateway's `/readyz`; a gateway that does not answer is not ready, and says why. */
export async function askReadiness(gatewayUrl: string): Promise<Readiness> {
  try {
    const res = await fetch(`${gatewayUrl}/readyz`, { signal: AbortSignal.timeout(5_000) });
    return Readiness.parse(await res.json());
  } catch (err) {
    return { status: "unavailable", reason: `the gateway does not answer: ${(err as Error).message}`, redis: "unknown", engines: [] };
  }
}

export interface ReadinessWatch {
  stop: () => void;
}

/**
 * Watches the gateway's readiness and tells: every engine's state when it changes, the same
 * warnings again every `repeatMs` while it is not ready (never a "ready" it is not), and
 * `onReady` each time it becomes ready.
 */
export function watchReadiness(opts: {
  gatewayUrl: string;
  print: (line: string) => void;
  onReady: () => void;
  everyMs?: number;
  repeatMs?: number;
}): ReadinessWatch {
  let last = "";
  let lastPrinted = 0;
  let wasReady = false;
  let stopped = false;
  let timer: NodeJS.Timeout | null = null;
  const round = async () => {
    const r = await askReadiness(opts.gatewayUrl);
    if (stopped) return;
    const lines = readinessLines(r);
    if (r.engines.length === 0 && r.status !== "ready") lines.push(`WARNING: rollgate is NOT READY: ${r.reason}`);
    const text = lines.join("\n");
    const now = Date.now();
    const ready = r.status === "ready";
    if (text !== last || (!ready && now - lastPrinted >= (opts.repeatMs ?? 15_000))) {
      for (const line of lines) opts.print(line);
      if (!ready) opts.print(`rollgate is up at ${opts.gatewayUrl} but NOT READY; tasks submitted now wait in the queue. Still checking…`);
      last = text;
      lastPrinted = now;
    }
    if (ready && !wasReady) opts.onReady();
    wasReady = ready;
  };
  const loop = () => {
    timer = setTimeout(() => void round().finally(() => !stopped && loop()), opts.everyMs ?? 1_000);
    timer.unref();
  };
  void round().finally(() => !stopped && loop());
  return {
    stop: () => {
      stopped = true;
      if (timer) clearTimeout(timer);
    },
  };
}
