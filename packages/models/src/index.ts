export * from "./profile.js";
export * from "./presets.js";
export * from "./resolve.js";
export * from "./parsers/index.js";
export * from "./template-fields.js";
