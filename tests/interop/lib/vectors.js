// One checker per vector area: (vector) => void, asserting that this client computes the
// vector's output from its input (or, for a vector with "error", throws).
export const CHECKERS = {};
