/**
 * prefix_merging against the rule as docs/data-model.md states it, written the slow obvious way: a
 * record extends the chain with the longest current sequence its prompt starts with (the oldest
 * on a tie; each chain's tip once), else starts a chain. Random sessions of new conversations,
 * continuations, retries, branches inside a prompt, empty outputs, length cuts and a branch's
 * replayed records (trained or not); prefix_tree's flat traces must be the same.
 */
import type { CompletionRecord } from "@rollgate/protocol";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { makeRecord } from "./__fixtures__/make-record.js";
import { buildTrajectory } from "./index.js";

function reference(records: readonly CompletionRecord[], trainReplayed: boolean) {
  const chains: { seq: number[]; prompt_ids: number[]; response_ids: number[]; loss_mask: number[]; response_logprobs: number[]; weight_versions: (string | null)[]; completion_ids: string[]; finish_reason: string }[] = [];
  for (const r of [...records].sort((a, b) => a.seq - b.seq)) {
    const p = r.prompt_ids;
    let best = -1;
    chains.forEach((c, i) => {
      if (c.seq.length <= p.length && c.seq.every((t, k) => p[k] === t) && (best < 0 || c.seq.length > chains[best]!.seq.length)) best = i;
    });
    const trained = r.replayed_from === undefined || trainReplayed;
    const out = {
      ids: r.output_ids,
      mask: r.output_ids.map(() => (trained ? 1 : 0)),
      lps: r.output_logprobs.map((l) => (trained ? l : 0)),
      versions: r.output_ids.map(() => (trained ? r.weight_version : null)),
    };
    if (best < 0) {
      chains.push({ seq: [...p, ...r.output_ids], prompt_ids: [...p], response_ids: [...out.ids], loss_mask: out.mask, response_logprobs: out.lps, weight_versions: out.versions, completion_ids: [r.id], finish_reason: r.finish_reason });
      continue;
    }
    const c = chains[best]!;
    const glue = p.slice(c.seq.length);
    c.response_ids.push(...glue, ...out.ids);
    c.loss_mask.push(...glue.map(() => 0), ...out.mask);
    c.response_logprobs.push(...glue.map(() => 0), ...out.lps);
    c.weight_versions.push(...glue.map(() => null), ...out.versions);
    c.completion_ids.push(r.id);
    c.seq = [...p, ...r.output_ids];
    c.finish_reason = r.finish_reason;
  }
  return chains.map(({ seq: _seq, ...t }) => t);
}

const token = fc.integer({ min: 0, max: 2 });
const step = fc.record({
  of: fc.nat(),
  kind: fc.integer({ min: 0, max: 4 }),
  keep: fc.nat(),
  glue: fc.array(token, { maxLength: 3 }),
  out: fc.array(token, { maxLength: 3 }),
  replayed: fc.boolean(),
  cut: fc.boolean(),
  v2: fc.boolean(),
});

type Step = typeof step extends fc.Arbitrary<infer T> ? T : never;

function session(steps: readonly Step[]): CompletionRecord[] {
  const records: CompletionRecord[] = [];
  steps.forEach((s, seq) => {
    const prev = records.length ? records[s.of % records.length] : undefined;
    let prompt: number[];
    if (!prev || s.kind === 0) prompt = [7, ...s.glue]; // a new conversation
    else if (s.kind <= 2) prompt = [...prev.prompt_ids, ...prev.output_ids, ...s.glue]; // continues an earlier call
    else if (s.kind === 3) prompt = [...prev.prompt_ids]; // a retry
    else prompt = [...prev.prompt_ids.slice(0, s.keep % (prev.prompt_ids.length + 1)), ...s.glue]; // branches inside a prompt
    const r = makeRecord({ id: `r${seq}`, seq, prompt_ids: prompt, output_ids: s.out, finish_reason: s.cut ? "length" : "stop", weight_version: s.v2 ? "v2" : "v1" });
    records.push(s.replayed ? { ...r, replayed_from: `source-${seq}` } : r);
  });
  return records;
}

describe("prefix_merging against the rule written the obvious way (property)", () => {
  it("the same traces, token for token, for prefix_merging and prefix_tree's flat view", () => {
    fc.assert(
      fc.property(fc.array(step, { minLength: 1, maxLength: 25 }), fc.boolean(), (steps, trainReplayed) => {
        const records = session(steps);
        const want = reference(records, trainReplayed);
        for (const builder of ["prefix_merging", "prefix_tree"] as const) {
          const got = buildTrajectory(records, builder, { trainReplayed }).traces.map((t) => ({
            prompt_ids: t.prompt_ids,
            response_ids: t.response_ids,
            loss_mask: t.loss_mask,
            response_logprobs: t.response_logprobs,
            weight_versions: t.weight_versions,
            completion_ids: t.completion_ids,
            finish_reason: t.finish_reason,
          }));
          expect(got).toEqual(want);
        }
      }),
      { numRuns: 1500, seed: 5 },
    );
  });
});
