// The ldp.v1 services, loaded at run time from the checkout's proto/ (no generated code): the
// client knows only what the .proto files and docs/ say.
import path from "node:path";
import { fileURLToPath } from "node:url";
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
export const PROTO_DIR = path.join(ROOT, "proto");
const INCLUDE_DIRS = [PROTO_DIR, path.join(PROTO_DIR, "third_party")];

// 64-bit integers as decimal strings (JavaScript numbers lose them past 2^53); enums by name;
// unset oneofs absent, with the name of the set member in the oneof's own field.
const LOADER_OPTIONS = {
  keepCase: true,
  longs: String,
  enums: String,
  bytes: Buffer,
  defaults: true,
  oneofs: true,
  includeDirs: INCLUDE_DIRS,
};

const FILES = [
  "ldp/v1/service.proto",
  "google/rpc/status.proto",
  "google/rpc/error_details.proto",
  "grpc/health/v1/health.proto",
];

let loaded = null;

/** The package definition and the gRPC object tree (`.ldp.v1`, `.google.rpc`, `.grpc.health.v1`). */
export function load() {
  if (loaded === null) {
    const definition = protoLoader.loadSync(FILES, LOADER_OPTIONS);
    loaded = { definition, tree: grpc.loadPackageDefinition(definition) };
  }
  return loaded;
}

/** The protobufjs type of a fully qualified message name, for encoding outside a call. */
export function messageType(fullName) {
  const entry = load().definition[fullName];
  if (entry === undefined || entry.type === undefined) {
    throw new Error(`no message ${fullName} in proto/`);
  }
  return entry;
}

/** Encode or decode a message by name through the same serializers the gRPC stubs use. */
export function encode(fullName, object) {
  return messageType(fullName).serialize(object);
}

export function decode(fullName, bytes) {
  return messageType(fullName).deserialize(bytes);
}
