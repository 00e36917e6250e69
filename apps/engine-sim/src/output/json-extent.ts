/** Where a JSON value written so far ends: shared with the gateway's own parsers (@rollgate/pyjson). */
export { stringEnd, valueEnd } from "@rollgate/pyjson";
