import type { CompletionRecord } from "@rollgate/protocol";
import { outputColumns, trainedVersionRuns } from "./records.js";
import type { BuiltTraces } from "./types.js";

/** The `per_request` builder: one trace per record, its whole output trainable. */
export function perRequestTraces(records: readonly CompletionRecord[], trainReplayed = false): BuiltTraces {
  return {
    traces: records.map((r) => ({
      ...columns(outputColumns(r, trainReplayed)),
      prompt_ids: r.prompt_ids.slice(),
      response_ids: r.output_ids.slice(),
      completion_ids: [r.id],
      finish_reason: r.finish_reason,
      ...(r.routed_experts ? { routed_experts: r.routed_experts } : {}),
    })),
    spans: records.map((r) => [{ record_id: r.id, start: 0, output_start: 0, end: r.output_ids.length }]),
    records: records.map((r) => [r]),
    record_versions: records.map((r) => trainedVersionRuns(r, trainReplayed)),
    breaks: [],
  };
}

function columns(c: ReturnType<typeof outputColumns>) {
  return { response_logprobs: c.logprobs, loss_mask: c.mask, weight_versions: c.versions };
}
