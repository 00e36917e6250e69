export * from "./keys.js";
export * from "./tasks.js";
export * from "./sessions.js";
export * from "./routing.js";
export * from "./weights.js";
export * from "./admin.js";
export * from "./rate-limit.js";
export * from "./client.js";
