export { RollgateClient, isOutage, isTerminal, type WeightLoad } from "./client.js";
export type {
  RollgateClientOptions,
  GroupRequest,
  ListTasksOptions,
  TaskPage,
  WaitOptions,
  StreamEventsOptions,
  TrajectoryOptions,
  TrainerSamples,
  TrajectoryAnswerMap,
  PauseOptions,
  CreateSessionRequest,
} from "./client.js";
export { RollgateError } from "./errors.js";
export { SseParser, type SseMessage } from "./sse.js";
export { DEFAULT_SIGNATURE_TOLERANCE_SECONDS, signBody, signDelivery, verifyDelivery, verifySignature } from "./signature.js";
export type { DeliveryRefusal, SignedDelivery, VerifyDeliveryHeaders } from "./signature.js";
export { startCallbackServer, type CallbackServer, type CallbackServerOptions, type CallbackDelivery, type GroupCallbackBody } from "./callback.js";
export { TRAINER_FORMATS, type TrainerFormat, type TrainerFormatMap, type VerlSample, type SlimeSample, type PrimeRlSample } from "@rollgate/trajectory";
export type { TaskInput, TaskRecord, TaskResult, TaskEvent, TaskStatus, TaskAccepted, Trajectory, Trace, Session, CompletionRecord, DecodedTrajectory, DecodedSegment } from "@rollgate/protocol";
