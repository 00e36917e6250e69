export * from "./children.js";
export * from "./ports.js";
export * from "./redis.js";
export * from "./prefixes.js";
export * from "./random.js";
