import type { CompletionRecord } from "@rollgate/protocol";
import { outputVersions, versionRuns } from "./records.js";
import type { BuiltTraces } from "./types.js";

/** The `per_request` builder: one trace per record, its whole output trainable. */
export function perRequestTraces(records: readonly CompletionRecord[]): BuiltTraces {
  return {
    traces: records.map((r) => ({
      prompt_ids: r.prompt_ids.slice(),
      response_ids: r.output_ids.slice(),
      response_logprobs: r.output_logprobs.slice(),
      loss_mask: r.output_ids.map(() => 1 as const),
      weight_versions: outputVersions(r),
      completion_ids: [r.id],
      finish_reason: r.finish_reason,
      ...(r.routed_experts ? { routed_experts: r.routed_experts } : {}),
    })),
    spans: records.map((r) => [{ record_id: r.id, start: 0, output_start: 0, end: r.output_ids.length }]),
    records: records.map((r) => [r]),
    record_versions: records.map(versionRuns),
    breaks: [],
  };
}
