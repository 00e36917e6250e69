export * from "./connection.js";
export * from "./names.js";
export * from "./jobs.js";
export * from "./producers.js";
