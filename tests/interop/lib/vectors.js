// One checker per vector area: (vector) => void, asserting that this client computes the vector's
// output from its input, or throws where the vector's output is {"error": ...}.
import assert from "node:assert/strict";
import { compileEncoder, double } from "./encoders.js";

/** A vector's expected value in this client's representation (integers as BigInt). */
function expected(value) {
  if (Array.isArray(value)) return value.map(expected);
  if (typeof value === "string" && /^-?\d+$/.test(value)) return BigInt(value);
  if (typeof value === "number" && Number.isInteger(value)) return BigInt(value);
  return double(value);
}

function actual(value) {
  if (Array.isArray(value)) return value.map(actual);
  if (typeof value === "number" && Number.isInteger(value)) return BigInt(value);
  return value;
}

/** Encoder areas (§11): input {encoder, points | point} -> output {values} or {error}. */
function encoderChecker(vector) {
  const { input, output } = vector;
  if ("error" in output) {
    assert.throws(() => {
      const encode = compileEncoder(input.encoder);
      if ("point" in input) encode(input.point);
    }, undefined, `must be rejected: ${output.error}`);
    return;
  }
  const encode = compileEncoder(input.encoder);
  input.points.forEach((point, i) => {
    assert.deepEqual(actual(encode(point)), expected(output.values[i]), `point ${JSON.stringify(point)}`);
  });
}

export const CHECKERS = {
  encoder_categorical: encoderChecker,
  encoder_uniform_grid: encoderChecker,
  encoder_grid_tree: encoderChecker,
  encoder_cell_list: encoderChecker,
  encoder_bit_vector: encoderChecker,
  encoder_nearest: encoderChecker,
  encoder_vector_maps: encoderChecker,
};
