// Random bits and the draws taken from them (docs/protocol.md §6). A device MAY use any CSPRNG;
// the vectors fix the keyed HMAC-SHA256 stream (§6.1), and the simulated devices of a campaign draw
// from a seeded AES-256-CTR stream so that a campaign is reproducible from its seed. Every draw
// consumes the stream bit by bit, most significant bit of each byte first, with no alignment.
import crypto from "node:crypto";

const SIM_CHUNK = 1 << 16;

/** A stream of random bits (from `refill()`, one chunk of bytes at a time) and the six draws. */
export class ByteStream {
  constructor(refill) {
    this.refill = refill; // () => Buffer of fresh bytes
    this.buffer = Buffer.alloc(0);
    this.bit = 0; // the next unread bit of `buffer`
    this.trace = null; // an array: every draw, as the vectors list them (§7)
    this.depth = 0;
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

  /** §6.1: B_i = HMAC-SHA256(K, i as 8 bytes big-endian), i = 0, 1, ... */
  static keyed(key) {
    let counter = 0n;
    return new ByteStream(() => {
      const block = Buffer.alloc(8);
      block.writeBigUInt64BE(counter);
      counter += 1n;
      return crypto.createHmac("sha256", key).update(block).digest();
    });
  }

  record(entry) {
    if (this.trace !== null && this.depth === 0) this.trace.push(entry);
  }

  /** Runs `fn` as one draw: the draws it takes inside are not recorded on their own. */
  inner(fn) {
    this.depth += 1;
    try {
      return fn();
    } finally {
      this.depth -= 1;
    }
  }

  /** The next k <= 32 bits as a Number, most significant first. */
  bitsNumber(k) {
    let value = 0;
    while (k > 0) {
      if (this.bit === this.buffer.length * 8) {
        this.buffer = this.refill();
        this.bit = 0;
      }
      const byte = this.buffer[this.bit >> 3];
      const available = 8 - (this.bit & 7);
      const take = Math.min(available, k);
      value = value * 2 ** take + ((byte >> (available - take)) & ((1 << take) - 1));
      this.bit += take;
      k -= take;
    }
    return value;
  }

  /** randbits(k): the next k bits as an unsigned integer (BigInt), most significant first. */
  randbits(k) {
    const offset = this.bit & 7;
    const bytes = Math.ceil((offset + k) / 8);
    const start = this.bit >> 3;
    if (k > 32 && start + bytes <= this.buffer.length) {
      // Within the buffer: the covering bytes at once, then the k bits cut out of them.
      const word = BigInt("0x" + this.buffer.toString("hex", start, start + bytes));
      const value = (word >> BigInt(8 * bytes - offset - k)) & ((1n << BigInt(k)) - 1n);
      this.bit += k;
      this.record(["randbits", k, value]);
      return value;
    }
    let value = 0n;
    let left = k;
    while (left > 32) {
      value = (value << 32n) | BigInt(this.bitsNumber(32));
      left -= 32;
    }
    value = (value << BigInt(left)) | BigInt(this.bitsNumber(left));
    this.record(["randbits", k, value]);
    return value;
  }

  /** token_bytes(n): randbits(8 n) as n big-endian bytes. */
  tokenBytes(n) {
    const out = Buffer.alloc(n);
    for (let i = 0; i < n; i += 1) out[i] = this.bitsNumber(8);
    this.record(["token_bytes", n, out]);
    return out;
  }

  /** randbelow(n) by rejection of randbits(bitlen(n - 1)); n = 1 takes nothing. */
  randbelow(n) {
    n = BigInt(n);
    if (n < 1n) throw new RangeError(`randbelow needs n >= 1, got ${n}`);
    let value = 0n;
    if (n > 1n) {
      const b = (n - 1n).toString(2).length;
      if (b <= 32) {
        const small = Number(n);
        let v;
        do v = this.bitsNumber(b); while (v >= small);
        value = BigInt(v);
      } else {
        do value = this.inner(() => this.randbits(b)); while (value >= n);
      }
    }
    this.record(["randbelow", n, value]);
    return value;
  }

  /** bernoulli(num, den): randbelow(den) < num, the pair as given. */
  bernoulli(num, den) {
    const result = this.inner(() => this.randbelow(den)) < BigInt(num);
    this.record(["bernoulli", BigInt(num), BigInt(den), result ? 1 : 0]);
    return result;
  }

  /** uniform(): randbits(53) * 2^-53. */
  uniform() {
    return Number(this.inner(() => this.randbits(53))) * 2 ** -53;
  }

  /** gauss(): Box-Muller on u1 = 1 - uniform(), then u2 = uniform(). */
  gauss() {
    const u1 = 1 - this.uniform();
    const u2 = this.uniform();
    return Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2);
  }
}
