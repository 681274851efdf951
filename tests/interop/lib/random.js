// Random bytes and the draws taken from them. A device MAY use any CSPRNG in production
// (docs/protocol.md §6); the simulated devices of a campaign draw from a seeded AES-256-CTR stream
// so that a campaign is reproducible from its seed, and the vectors fix a keyed HMAC-SHA256 stream.
import crypto from "node:crypto";

// Draws below 2^53 run on Numbers (exact integers in a double); larger ones on BigInt.
const FAST = 2 ** 53;
const SIM_CHUNK = 1 << 16;

/** A stream of random bytes (from `refill()`, one chunk at a time) and the integer draws on it. */
export class ByteStream {
  constructor(refill) {
    this.refill = refill; // () => Buffer of fresh bytes
    this.buffer = Buffer.alloc(0);
    this.position = 0;
  }

  /** The OS CSPRNG. */
  static secure() {
    return new ByteStream(() => crypto.randomBytes(4096));
  }

  /** A seeded simulation stream: AES-256-CTR under the 32-byte `key` from a zero counter. */
  static simulation(key) {
    const cipher = crypto.createCipheriv("aes-256-ctr", key, Buffer.alloc(16));
    const zeros = Buffer.alloc(SIM_CHUNK);
    return new ByteStream(() => cipher.update(zeros));
  }

  /** HMAC-SHA256(key, counter as 8 bytes big-endian) for counter = 0, 1, ... */
  static keyed(key) {
    let counter = 0n;
    return new ByteStream(() => {
      const block = Buffer.alloc(8);
      block.writeBigUInt64BE(counter);
      counter += 1n;
      return crypto.createHmac("sha256", key).update(block).digest();
    });
  }

  /** The next n bytes of the stream. */
  next(n) {
    const parts = [];
    let needed = n;
    while (needed > 0) {
      if (this.position === this.buffer.length) {
        this.buffer = this.refill();
        this.position = 0;
      }
      const take = Math.min(needed, this.buffer.length - this.position);
      parts.push(this.buffer.subarray(this.position, this.position + take));
      this.position += take;
      needed -= take;
    }
    return parts.length === 1 ? parts[0] : Buffer.concat(parts);
  }

  /** A uniform integer in [0, 2^bits) from ceil(bits / 8) bytes, big-endian, top bits cleared. */
  randbits(bits) {
    if (bits === 0) return 0n;
    if (bits <= 53) return BigInt(this.randbitsNumber(bits));
    const bytes = this.next(Math.ceil(bits / 8));
    return BigInt("0x" + bytes.toString("hex")) & ((1n << BigInt(bits)) - 1n);
  }

  /** randbits for bits <= 53, as a Number (the same bytes, the same value). */
  randbitsNumber(bits) {
    const count = Math.ceil(bits / 8);
    if (this.position + count > this.buffer.length) {
      // Across a chunk boundary: gather the bytes first (rare).
      const bytes = this.next(count);
      this.buffer = Buffer.concat([bytes, this.buffer.subarray(this.position)]);
      this.position = 0;
    }
    const at = this.position;
    this.position += count;
    if (count <= 6) {
      const value = this.buffer.readUIntBE(at, count);
      return bits === count * 8 ? value : value % 2 ** bits;
    }
    // 7 bytes: the first holds the top bits - 48 bits; mask it before scaling (exact below 2^53).
    const high = this.buffer[at] % 2 ** (bits - 48);
    return high * 2 ** 48 + this.buffer.readUIntBE(at + 1, 6);
  }

  /** A uniform integer in [0, n) by rejection of randbits(bit length of n - 1). */
  randbelow(n) {
    if (typeof n === "number" && n <= FAST) return BigInt(this.randbelowNumber(n));
    n = BigInt(n);
    if (n <= 0n) throw new RangeError(`randbelow needs n >= 1, got ${n}`);
    if (n === 1n) return 0n;
    if (n <= BigInt(FAST)) return BigInt(this.randbelowNumber(Number(n)));
    const bits = (n - 1n).toString(2).length;
    for (;;) {
      const value = this.randbits(bits);
      if (value < n) return value;
    }
  }

  /** randbelow for n <= 2^53, as a Number. */
  randbelowNumber(n) {
    if (n <= 0) throw new RangeError(`randbelow needs n >= 1, got ${n}`);
    if (n === 1) return 0;
    const bits = Math.floor(Math.log2(n - 1)) + 1;
    // log2 of a double can round up across a power of two; the bit length is exact after the fix.
    const exact = 2 ** (bits - 1) > n - 1 ? bits - 1 : bits;
    for (;;) {
      const value = this.randbitsNumber(exact);
      if (value < n) return value;
    }
  }

  /**
   * A reusable coin, true with probability num / den exactly: bernoulli(num, den) with the bit
   * length of den - 1 computed once (for the many coins of one report).
   */
  coin(num, den) {
    if (BigInt(den) > BigInt(FAST)) return () => this.bernoulli(num, den);
    const n = Number(den);
    const m = Number(num);
    if (n === 1) return () => 0 < m;
    let bits = 0;
    while (2 ** bits < n) bits += 1; // bit length of n - 1
    return () => {
      for (;;) {
        const value = this.randbitsNumber(bits);
        if (value < n) return value < m;
      }
    };
  }

  /** True with probability num / den, exactly (randbelow(den) < num). */
  bernoulli(num, den) {
    if (typeof den === "number" && den <= FAST) return this.randbelowNumber(den) < num;
    return this.randbelow(BigInt(den)) < BigInt(num);
  }

  tokenBytes(n) {
    return Buffer.from(this.next(n));
  }
}
