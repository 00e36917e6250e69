export * from "./errors.js";
export * from "./ids.js";
export * from "./chat.js";
export * from "./trace.js";
export * from "./record.js";
export * from "./session.js";
export * from "./task.js";
export * from "./env.js";
