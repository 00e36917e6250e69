export * from "./children.js";
export * from "./ports.js";
export * from "./redis.js";
