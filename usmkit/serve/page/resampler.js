// Streaming sample-rate conversion for the page: a windowed-sinc low-pass interpolator.
//
// Output sample n sits at input position p = n * inRate / outRate and is
//   y[n] = sum_k x[k] * h(p - k),  h(t) = 2 fc sinc(2 fc t) * hann(t / width),  |p - k| < width,
// with the cut-off fc (cycles per input sample) just below the lower Nyquist frequency, so that
// downsampling (48 kHz -> 16 kHz) does not fold the band above 8 kHz into speech. Blocks of any size
// give the same output as the whole signal at once: the input before the stream counts as zeros, and
// an output sample is computed once the input reaches p + width (the output lags by `width` inputs).
// `flush()` ends the stream (zeros after it), for the last samples. Equal rates pass through.

export class StreamResampler {
  constructor(inRate, outRate, zeroCrossings = 16) {
    if (!(inRate > 0 && outRate > 0)) throw new Error(`sample rates must be > 0, got ${inRate} -> ${outRate}`);
    this.inRate = inRate;
    this.outRate = outRate;
    this.step = inRate / outRate; // input samples per output sample
    const scale = Math.min(1, outRate / inRate);
    this.fc = 0.5 * scale * 0.95; // cut-off, cycles per input sample
    this.width = Math.ceil(zeroCrossings / scale); // half the filter length, in input samples
    this.same = inRate === outRate; // nothing to do
    this.base = -this.width; // absolute index of buffer[0]; the stream starts with `width` zeros
    this.buffer = new Float32Array(this.width); // input samples [base, base + buffer.length)
    this.next = 0; // index of the next output sample
  }

  kernel(t) {
    if (Math.abs(t) >= this.width) return 0;
    const x = 2 * this.fc * t;
    const sinc = x === 0 ? 1 : Math.sin(Math.PI * x) / (Math.PI * x);
    const hann = 0.5 + 0.5 * Math.cos((Math.PI * t) / this.width);
    return 2 * this.fc * sinc * hann;
  }

  // input: Float32Array at inRate -> Float32Array at outRate (what became computable)
  process(input) {
    if (this.same) return Float32Array.from(input);
    if (input.length) {
      const joined = new Float32Array(this.buffer.length + input.length);
      joined.set(this.buffer);
      joined.set(input, this.buffer.length);
      this.buffer = joined;
    }
    return this.drain(this.base + this.buffer.length);
  }

  // end of the stream: the last outputs, whose windows reach past the last input (zeros there)
  flush() {
    if (this.same) return new Float32Array(0);
    const inputs = this.base + this.buffer.length; // real inputs in all
    const outputs = Math.ceil(inputs / this.step); // the whole signal's output count
    const joined = new Float32Array(this.buffer.length + this.width + 1);
    joined.set(this.buffer);
    this.buffer = joined;
    return this.drain(this.base + this.buffer.length, outputs);
  }

  // outputs whose window ends before `available` (absolute input index), up to `limit` outputs in all
  drain(available, limit = Infinity) {
    const out = [];
    for (;;) {
      if (this.next >= limit) break;
      const p = this.next * this.step;
      const hi = Math.floor(p + this.width);
      if (hi >= available) break;
      const lo = Math.ceil(p - this.width);
      let acc = 0;
      for (let k = Math.max(lo, this.base); k <= hi; k++) acc += this.buffer[k - this.base] * this.kernel(p - k);
      out.push(acc);
      this.next++;
    }
    // keep the inputs the next output still needs
    const keepFrom = Math.ceil(this.next * this.step - this.width);
    if (keepFrom > this.base) {
      this.buffer = this.buffer.slice(keepFrom - this.base);
      this.base = keepFrom;
    }
    return Float32Array.from(out);
  }
}
