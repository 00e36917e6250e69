import type { Context } from "./output.js";

/** The part of `GET /admin/engines` that `rollgate up` shows: each engine's preflight. */
interface EnginePreflight {
  index: number;
  kind: string;
  url: string;
  profile: string;
  preflight: {
    vocab_size: number | null;
    version: string | null;
    token_in: { available: boolean; route: string | null; end_of_turn: string | null; why: string | null };
    tool_turn: { round_trips: boolean | null; detail: string };
    reasoning: { dropped_at_user_turn: boolean | null; detail: string };
    pause: { abort_mode: string | null; why: string };
    errors: string[];
  } | null;
}

/**
 * Prints what will hold on each engine before a run (the gateway's preflight): profile and
 * vocabulary, token-in, whether tool turns re-render to their ids, whether the template drops
 * reasoning at new user turns (so traces break there without token-in), and the abort pause.
 */
export async function printPreflight(ctx: Context, url: string): Promise<void> {
  let engines: EnginePreflight[];
  try {
    const res = await fetch(`${url}/admin/engines?wait_s=60`, { headers: ctx.apiKey ? { authorization: `Bearer ${ctx.apiKey}` } : {} });
    if (res.status !== 200) throw new Error(`GET /admin/engines answered ${res.status}`);
    engines = ((await res.json()) as { engines: EnginePreflight[] }).engines;
  } catch (err) {
    ctx.err(`rollgate up: no engine preflight: ${(err as Error).message}`);
    return;
  }
  if (ctx.json) {
    ctx.printJson({ engines: engines.map((e) => ({ index: e.index, kind: e.kind, url: e.url, profile: e.profile, preflight: e.preflight })) }, true);
    return;
  }
  const s = ctx.style;
  for (const e of engines) {
    const p = e.preflight;
    ctx.out(`  engine ${e.index}   ${s.bold(`${e.kind} ${e.url}`)} · profile ${s.cyan(e.profile)}${p?.version ? ` · ${e.kind} ${p.version}` : ""}`);
    if (!p) {
      ctx.out(`             preflight still running (GET /admin/engines shows it)`);
      continue;
    }
    const mark = (ok: boolean | null) => (ok === null ? s.gray("?") : ok ? s.green("✓") : s.yellow("!"));
    ctx.out(`             vocabulary ${p.vocab_size ?? "unbounded"}`);
    ctx.out(`             ${mark(p.token_in.available)} token-in ${p.token_in.available ? `via ${p.token_in.route} (turns end with ${p.token_in.end_of_turn})` : `off: ${p.token_in.why}`}`);
    ctx.out(`             ${mark(p.tool_turn.round_trips)} tool turns: ${p.tool_turn.detail}`);
    ctx.out(`             ${mark(p.reasoning.dropped_at_user_turn === null ? null : !p.reasoning.dropped_at_user_turn || p.token_in.available)} reasoning: ${p.reasoning.detail}`);
    ctx.out(`             abort pause: ${p.pause.abort_mode ?? "unknown"} (${p.pause.why})`);
    for (const err of p.errors) ctx.out(`             ${s.yellow("!")} ${err}`);
  }
}
