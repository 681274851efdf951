// SubmitPackedRequest.packed (docs/protocol.md §8): not specified yet.
export function packBatch() {
  throw new Error("the packed batch layout is not specified (docs/protocol.md §8)");
}
