export * from "./canonical.js";
export * from "./accumulate.js";
export * from "./openai-chat.js";
export * from "./sampling.js";
export * from "./echoed-history.js";
export * from "./reasoning-seal.js";
