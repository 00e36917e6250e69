export { buildTrajectory, perRequest, prefixMerging, prefixTree } from "./build.js";
export { buildPrefixTree, pathOf } from "./prefix-tree.js";
export { classifyTraces, CONTINUATION_MARKERS, SUMMARY_REQUEST_MARKERS, type TraceOrigin } from "./kinds.js";
export { perRequestTraces } from "./per-request.js";
export { prefixMergingTraces } from "./prefix-merging.js";
export { classifyBreak, type BreakEvidence, type ChainView } from "./breaks.js";
export { checkRecordInvariants, checkTraceInvariants, checkTreeInvariants, type TraceCheckOptions } from "./invariants.js";
export { TrajectoryInvariantError } from "./errors.js";
export {
  toTrainerFormat,
  TRAINER_FORMATS,
  type TrainerFormat,
  type TrainerFormatMap,
  type VerlSample,
  type SlimeSample,
  type PrimeRlSample,
} from "./formats.js";
export {
  type BuildOptions,
  type TemplateFacts,
  type BuiltTrajectory,
  type BuiltTrajectoryStats,
  type BuiltTraceBreak,
  type RecordSpan,
  type TraceStats,
} from "./types.js";
