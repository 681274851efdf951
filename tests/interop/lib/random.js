// Random bytes for the simulated devices. A device MAY use any CSPRNG (docs/protocol.md §6); the
// interop client draws from a keyed HMAC-SHA256 stream so that a campaign is reproducible from its
// seed, and from the OS CSPRNG otherwise.
import crypto from "node:crypto";

/**
 * A stream of random bytes and the integer draws taken from it. `next(n)` is the only source of
 * bytes; every draw below is defined on top of it.
 */
export class ByteStream {
  constructor(next) {
    this.next = next; // (n) => Buffer of n fresh bytes
  }

  /** The OS CSPRNG. */
  static secure() {
    return new ByteStream((n) => crypto.randomBytes(n));
  }

  /** HMAC-SHA256(key, counter as 8 bytes big-endian) for counter = 0, 1, ...: a seeded stream. */
  static keyed(key) {
    let counter = 0n;
    let buffer = Buffer.alloc(0);
    return new ByteStream((n) => {
      while (buffer.length < n) {
        const block = Buffer.alloc(8);
        block.writeBigUInt64BE(counter);
        counter += 1n;
        buffer = Buffer.concat([buffer, crypto.createHmac("sha256", key).update(block).digest()]);
      }
      const out = buffer.subarray(0, n);
      buffer = buffer.subarray(n);
      return out;
    });
  }

  /** A uniform integer in [0, 2^bits) from ceil(bits / 8) bytes, big-endian, top bits cleared. */
  randbits(bits) {
    if (bits === 0) return 0n;
    const bytes = this.next(Math.ceil(bits / 8));
    let value = BigInt("0x" + bytes.toString("hex"));
    value &= (1n << BigInt(bits)) - 1n;
    return value;
  }

  /** A uniform integer in [0, n) by rejection of randbits(bit length of n - 1). */
  randbelow(n) {
    n = BigInt(n);
    if (n <= 0n) throw new RangeError(`randbelow needs n >= 1, got ${n}`);
    if (n === 1n) return 0n;
    const bits = (n - 1n).toString(2).length;
    for (;;) {
      const value = this.randbits(bits);
      if (value < n) return value;
    }
  }

  /** True with probability num / den, exactly. */
  bernoulli(num, den) {
    return this.randbelow(den) < BigInt(num);
  }

  tokenBytes(n) {
    return Buffer.from(this.next(n));
  }

  /** A float in [0, 1) with 53 random bits (simulation only: no privacy coin is a float). */
  uniform() {
    return Number(this.randbits(53)) / 2 ** 53;
  }

  /** A standard normal draw by Box-Muller (simulation only). */
  gauss() {
    const u = 1 - this.uniform();
    const v = this.uniform();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
  }
}
