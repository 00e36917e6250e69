import { joinRoutedRows, type CompletionRecord, type RoutedExperts } from "@rollgate/protocol";
import { TrajectoryInvariantError } from "./errors.js";

/**
 * A merged trace's routed experts (R3), gathered record by record: the positions a record adds to
 * the trace (from the one before its first new token, which its own forward pass fed, to the end of
 * its output) take that record's rows; earlier positions keep the rows of the record that sampled
 * from them. The trace has routing only when every record it holds has some.
 */
export class RoutingPieces {
  private readonly pieces: { experts: RoutedExperts; from: number; to: number }[] = [];
  private complete = true;

  /** Adds a record whose tokens continue the trace from position `from` (0 for the first). */
  add(record: CompletionRecord, from: number): void {
    const r = record.routed_experts;
    if (!r) {
      this.complete = false;
      return;
    }
    const first = this.pieces[0]?.experts;
    // Rows of another width (another model's layers × top-k) cannot continue this trace's routing.
    if (first && first.width !== r.width) {
      throw new TrajectoryInvariantError("routed_experts_misaligned", `routed experts rows have width ${r.width}, the trace's earlier records' width ${first.width}`, { record_id: record.id });
    }
    this.pieces.push({ experts: r, from: Math.max(from, 0), to: Math.max(record.prompt_ids.length + record.output_ids.length - 1, 0) });
  }

  /** `{routed_experts}` for the trace, or nothing when a record had none. */
  field(): { routed_experts?: RoutedExperts } {
    if (!this.complete || this.pieces.length === 0) return {};
    const joined = joinRoutedRows(this.pieces);
    return joined ? { routed_experts: joined } : {};
  }
}
