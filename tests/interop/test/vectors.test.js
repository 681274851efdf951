// Every test vector of proto/vectors/v1 through this client (node --test). An area (one JSON file)
// this client does not implement is reported as skipped by name, never silently left out.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { describe, test } from "node:test";
import { Unsupported } from "../lib/encoders.js";
import { CHECKERS } from "../lib/vectors.js";
import { PROTO_DIR } from "../lib/proto.js";

// INTEROP_VECTOR_DIR: check another directory of v1 vectors (a spec under review) instead.
const VECTOR_DIR = process.env.INTEROP_VECTOR_DIR ?? path.join(PROTO_DIR, "vectors", "v1");
const files = fs.readdirSync(VECTOR_DIR).filter((name) => name.endsWith(".json")).sort();

test("the vector directory holds areas", () => {
  assert.ok(files.length > 0, `no vectors in ${VECTOR_DIR}`);
});

for (const file of files) {
  const document = JSON.parse(fs.readFileSync(path.join(VECTOR_DIR, file), "utf8"));
  const area = document.area;
  const checker = CHECKERS[area];
  describe(`${area} (${document.section})`, () => {
    assert.equal(`${area}.json`, file);
    assert.equal(document.vectors_version, 1);
    if (checker === undefined) {
      test(`${area}: every vector`, { skip: `area ${area} is not implemented by this client` });
      return;
    }
    assert.ok(document.vectors.length > 0, `${file} holds no vectors`);
    for (const vector of document.vectors) {
      test(vector.name, (t) => {
        try {
          checker(vector);
        } catch (error) {
          // A mechanism or encoder this client declines: skipped by name, with what it lacks.
          if (!(error instanceof Unsupported)) throw error;
          t.skip(`not implemented by this client: ${error.message}`);
        }
      });
    }
  });
}
