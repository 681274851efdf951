// The draws do not depend on how the stream's bytes arrive (HMAC blocks of 32 bytes, simulation
// chunks of 64 KiB): the fast paths that read within one chunk give the bits of the slow ones.
import assert from "node:assert/strict";
import crypto from "node:crypto";
import { test } from "node:test";
import { ByteStream } from "../lib/random.js";

function chunked(bytes, size) {
  let at = 0;
  return new ByteStream(() => {
    const chunk = bytes.subarray(at, at + size);
    at += size;
    return chunk;
  });
}

test("draws are the same whatever the chunk size of the stream", () => {
  const bytes = crypto.createHash("sha512").update("interop").digest();
  const source = Buffer.concat(Array.from({ length: 4096 }, (_, i) => crypto.createHash("sha256")
    .update(bytes).update(String(i)).digest()));
  const streams = [1, 3, 32, 1 << 16].map((size) => chunked(source, size));
  const sizes = [1, 7, 31, 32, 33, 53, 64, 65, 255, 1000, 1023];
  for (let round = 0; round < 40; round += 1) {
    const k = sizes[round % sizes.length];
    const draws = streams.map((s) => [s.randbits(k), s.randbelow(1000n + BigInt(round)), s.tokenBytes(3).toString("hex")]);
    for (const other of draws.slice(1)) assert.deepEqual(other, draws[0]);
  }
});
