// AudioWorklet processor: the microphone at the AudioContext's rate -> 16-bit PCM at the model's rate.
//
// Runs on the audio thread. Each render quantum (128 frames) of the first input channel is resampled
// (resampler.js) and converted to 16-bit integers; every `blockSamples` output samples (100 ms) go to
// the page as one ArrayBuffer, with the block's peak level. On {command: "flush"} it sends what is
// left (the resampler's tail included), then {flushed: true}.
import { StreamResampler } from "./resampler.js";

class PcmProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const targetRate = options.processorOptions.targetRate;
    this.resampler = new StreamResampler(sampleRate, targetRate); // sampleRate: the context's (a global here)
    this.blockSamples = Math.round(targetRate / 10);
    this.pending = new Int16Array(this.blockSamples);
    this.filled = 0;
    this.peak = 0;
    this.stopped = false;
    this.port.onmessage = (event) => {
      if (event.data.command === "flush") {
        this.push(this.resampler.flush());
        this.send();
        this.port.postMessage({ flushed: true });
        this.stopped = true;
      }
    };
  }

  push(samples) {
    for (let i = 0; i < samples.length; i++) {
      const s = Math.max(-1, Math.min(1, samples[i]));
      this.peak = Math.max(this.peak, Math.abs(s));
      this.pending[this.filled++] = Math.round(s * 32767);
      if (this.filled === this.blockSamples) this.send();
    }
  }

  send() {
    if (this.filled === 0) return;
    const block = this.pending.slice(0, this.filled);
    this.port.postMessage({ pcm: block.buffer, peak: this.peak }, [block.buffer]);
    this.filled = 0;
    this.peak = 0;
  }

  process(inputs) {
    if (this.stopped) return false;
    const channel = inputs[0] && inputs[0][0];
    if (channel) this.push(this.resampler.process(channel));
    return true;
  }
}

registerProcessor("pcm-16k", PcmProcessor);
