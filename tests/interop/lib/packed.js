// The packed batch of SubmitPackedRequest.packed (docs/protocol.md §8.3): writing it (the device)
// with @msgpack/msgpack in shortest forms, and reading it strictly (what a collector refuses or
// rejects), with a small reader of its own that keeps the msgpack types the rules depend on.
import { encode } from "@msgpack/msgpack";

export const MAX_BATCH_REPORTS = 10_000;
const FORMAT = 1;

/**
 * Integers in their shortest msgpack form: @msgpack/msgpack writes a Number in [-2^31, 2^32) as the
 * shortest integer but a larger one as a float64, so those go as BigInt (int64 / uint64, which is
 * then the shortest form).
 */
function integer(value) {
  const big = BigInt(value);
  return big >= -(2n ** 31n) && big < 2n ** 32n ? Number(big) : big;
}

function floatsBinary(values) {
  const out = Buffer.alloc(4 * values.length);
  values.forEach((v, i) => out.writeFloatLE(v, 4 * i));
  return out;
}

/** The list of a repeated-field message ({values: [...]}) or a bare list. */
const list = (v) => (Array.isArray(v) ? v : v.values);

/** §8.2: a Payload (as the proto loader gives it, or `{kind: value}`) in its packed form. */
export function packPayload(payload) {
  const which = payload.value ?? Object.keys(payload).find((k) => payload[k] !== undefined && payload[k] !== null);
  const v = payload[which];
  switch (which) {
    case "index": return integer(v);
    case "bits": return Buffer.from(v);
    case "hashed": return [3, integer(v.seed), integer(v.value)];
    case "integers": return [4, list(v).map(integer)];
    case "floats": return [5, floatsBinary(list(v))];
    case "signed_vector": {
      const inner = v.inner ?? (v.bits !== undefined && v.bits !== null ? "bits" : "floats");
      const packed = inner === "bits" ? Buffer.from(v.bits) : [5, floatsBinary(list(v.floats))];
      return [6, integer(v.seed), packed];
    }
    default: throw new Error(`no packed form for payload ${which}`);
  }
}

function packReport(report) {
  return [FORMAT, Buffer.from(report.report_id), report.campaign_id, integer(report.round), integer(report.group),
    report.payloads.map(packPayload)];
}

/** The packed batch [1, request_id, [report, ...]] as msgpack bytes. */
export function packBatch(requestId, reports) {
  return Buffer.from(encode([FORMAT, requestId, reports.map(packReport)], { useBigInt64: true }));
}

// -- reading --------------------------------------------------------------------------------

/** A batch refused as a whole (INVALID_ARGUMENT, field `packed`). */
export class Refused extends Error {}

// Longest legal lengths (§8.3): a string, a binary string, an array, a map.
const LIMITS = { str: 512, bin: 131_072, array: MAX_BATCH_REPORTS, map: 8 };

/** Typed msgpack values: {t: "int"|"float"|"str"|"bin"|"array"|"map"|"nil"|"bool", v}. */
class Reader {
  constructor(bytes) {
    this.b = Buffer.from(bytes);
    this.i = 0;
  }

  need(n) {
    if (this.i + n > this.b.length) throw new Refused("packed batch is not valid msgpack: the document is cut short");
  }

  u(n) {
    this.need(n);
    const v = n === 8 ? this.b.readBigUInt64BE(this.i) : BigInt(this.b.readUIntBE(this.i, n));
    this.i += n;
    return v;
  }

  s(n) {
    this.need(n);
    const v = n === 8 ? this.b.readBigInt64BE(this.i) : BigInt(this.b.readIntBE(this.i, n));
    this.i += n;
    return v;
  }

  length(kind, n) {
    if (n > LIMITS[kind]) {
      throw new Refused("packed batch is not valid msgpack: a string, binary string, array or map is longer than "
        + "any legal batch holds");
    }
    return n;
  }

  raw(n) {
    this.need(n);
    const v = this.b.subarray(this.i, this.i + n);
    this.i += n;
    return v;
  }

  str(n) {
    const bytes = this.raw(this.length("str", n));
    try {
      return { t: "str", v: new TextDecoder("utf-8", { fatal: true }).decode(bytes) };
    } catch {
      throw new Refused("packed batch is not valid msgpack: a string is not valid UTF-8");
    }
  }

  items(kind, n, header = null) {
    this.length(kind, n);
    if (header) header(n);
    const out = [];
    for (let k = 0; k < (kind === "map" ? 2 * n : n); k += 1) out.push(this.value());
    return { t: kind, v: out };
  }

  value(header = null) {
    this.need(1);
    const c = this.b[this.i];
    this.i += 1;
    if (c <= 0x7f) return { t: "int", v: BigInt(c) };
    if (c >= 0xe0) return { t: "int", v: BigInt(c - 0x100) };
    if (c >= 0xa0 && c <= 0xbf) return this.str(c & 0x1f);
    if (c >= 0x90 && c <= 0x9f) return this.items("array", c & 0x0f, header);
    if (c >= 0x80 && c <= 0x8f) return this.items("map", c & 0x0f);
    switch (c) {
      case 0xc0: return { t: "nil", v: null };
      case 0xc2: return { t: "bool", v: false };
      case 0xc3: return { t: "bool", v: true };
      case 0xc4: return { t: "bin", v: this.raw(this.length("bin", Number(this.u(1)))) };
      case 0xc5: return { t: "bin", v: this.raw(this.length("bin", Number(this.u(2)))) };
      case 0xc6: return { t: "bin", v: this.raw(this.length("bin", Number(this.u(4)))) };
      case 0xca: this.need(4); this.i += 4; return { t: "float", v: this.b.readFloatBE(this.i - 4) };
      case 0xcb: this.need(8); this.i += 8; return { t: "float", v: this.b.readDoubleBE(this.i - 8) };
      case 0xcc: return { t: "int", v: this.u(1) };
      case 0xcd: return { t: "int", v: this.u(2) };
      case 0xce: return { t: "int", v: this.u(4) };
      case 0xcf: return { t: "int", v: this.u(8) };
      case 0xd0: return { t: "int", v: this.s(1) };
      case 0xd1: return { t: "int", v: this.s(2) };
      case 0xd2: return { t: "int", v: this.s(4) };
      case 0xd3: return { t: "int", v: this.s(8) };
      case 0xd9: return this.str(Number(this.u(1)));
      case 0xda: return this.str(Number(this.u(2)));
      case 0xdb: return this.str(Number(this.u(4)));
      case 0xdc: return this.items("array", Number(this.u(2)), header);
      case 0xdd: return this.items("array", Number(this.u(4)), header);
      case 0xde: return this.items("map", Number(this.u(2)));
      case 0xdf: return this.items("map", Number(this.u(4)));
      default: throw new Refused("packed batch is not valid msgpack: it holds an extension type");
    }
  }
}

function containers(node) {
  if (node.t !== "array" && node.t !== "map") return 0;
  return 1 + node.v.reduce((sum, child) => sum + containers(child), 0);
}

const CAMPAIGN_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
const isInt = (n, lo, hi) => n.t === "int" && n.v >= lo && n.v <= hi;

/** A decoded payload in the vectors' JSON form, or null when it matches no row of §8.2. */
function readPayload(p) {
  if (isInt(p, 0n, (1n << 64n) - 1n)) return { index: p.v };
  if (p.t === "bin") return { bits: p.v.toString("hex") };
  if (p.t !== "array" || p.v.length === 0 || p.v[0].t !== "int") return { malformed: "expected" };
  const [tag, ...rest] = p.v;
  const floats = (n) => (n.t === "bin" && n.v.length % 4 === 0
    ? Array.from({ length: n.v.length / 4 }, (_, k) => n.v.readFloatLE(4 * k)) : null);
  if (tag.v === 3n && rest.length === 2 && isInt(rest[0], 0n, (1n << 64n) - 1n) && isInt(rest[1], 0n, (1n << 32n) - 1n)) {
    return { hashed: { seed: rest[0].v, value: rest[1].v } };
  }
  if (tag.v === 4n && rest.length === 1 && rest[0].t === "array"
    && rest[0].v.every((n) => isInt(n, -(1n << 63n), (1n << 63n) - 1n))) {
    return { integers: rest[0].v.map((n) => n.v) };
  }
  if (tag.v === 5n && rest.length === 1 && floats(rest[0]) !== null) return { floats: floats(rest[0]) };
  if (tag.v === 6n && rest.length === 2 && isInt(rest[0], 0n, (1n << 32n) - 1n)) {
    const inner = rest[1];
    if (inner.t === "bin") return { signed_vector: { seed: rest[0].v, bits: inner.v.toString("hex") } };
    if (inner.t === "array" && inner.v.length === 2 && isInt(inner.v[0], 5n, 5n) && floats(inner.v[1]) !== null) {
      return { signed_vector: { seed: rest[0].v, floats: floats(inner.v[1]) } };
    }
  }
  return { malformed: `tag ${tag.v}` };
}

/** One report, or {error} for a report rejected as MALFORMED_REPORT (§8.3). */
function readReport(node, where) {
  const shape = `${where}: expected [1, report_id, campaign_id, round, group, payloads]`;
  if (node.t !== "array" || node.v.length !== 6 || !isInt(node.v[0], 1n, 1n)) return { error: shape };
  const [, id, campaign, round, group, payloads] = node.v;
  if (id.t !== "bin" || id.v.length !== 16) return { error: `${where}: report_id must be 16 bytes` };
  if (campaign.t !== "str" || !CAMPAIGN_ID.test(campaign.v) || [...campaign.v].length > 128) {
    return { error: `${where}: campaign_id breaks its rule` };
  }
  if (!isInt(round, 0n, 4294967295n)) return { error: `${where}: round must be in [0, 4294967295]` };
  if (!isInt(group, 0n, 4095n)) return { error: `${where}: group must be in [0, 4095]` };
  if (payloads.t !== "array" || payloads.v.length < 1 || payloads.v.length > 8) {
    return { error: `${where}: payloads must be a list of 1 to 8 payloads` };
  }
  const decoded = payloads.v.map(readPayload);
  const bad = decoded.findIndex((p) => "malformed" in p);
  if (bad >= 0) return { error: `${where}.payloads[${bad}]: malformed payload` };
  return { campaign_id: campaign.v, group: group.v, payloads: decoded, report_id: id.v.toString("hex"), round: round.v };
}

/** §8.3: {request_id, reports} with each report decoded or {error}; throws Refused for the batch. */
export function readBatch(bytes) {
  const reader = new Reader(bytes);
  const top = reader.value();
  if (reader.i !== reader.b.length) throw new Refused("packed batch is not valid msgpack: bytes follow the end of the document");
  if (top.t !== "array" || top.v.length !== 3 || !isInt(top.v[0], 1n, 1n)) {
    throw new Refused("packed batch: expected [1, request_id, reports]");
  }
  const [, requestId, reports] = top.v;
  if (requestId.t !== "str" || [...requestId.v].length < 1 || [...requestId.v].length > 128) {
    throw new Refused("packed batch: request_id must be a string of 1 to 128 characters");
  }
  if (reports.t !== "array") throw new Refused("packed batch: reports must be a list");
  reports.v.forEach((report) => {
    if (containers(report) > 18) throw new Refused("packed batch: a report holds at most 18 arrays or maps");
  });
  return { request_id: requestId.v, reports: reports.v.map((r, k) => readReport(r, `reports[${k}]`)) };
}
